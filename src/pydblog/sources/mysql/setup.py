"""Start-up checks of the source server and pydblog's own tables in it.

Every problem found is named with the setting or grant and how to fix it; all of them are
reported together in one ``SourceError``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pymysql

from pydblog.config import SnapshotConfig
from pydblog.errors import SourceError
from pydblog.sources.mysql.connect import MySqlDsn, classify
from pydblog.sources.mysql.types import quote_ident

log = logging.getLogger(__name__)

PG_DEFAULT_SCHEMA = "public"


@dataclass(frozen=True, slots=True)
class OwnTables:
    """pydblog's signal and watermark tables, as ``(database, table)``, and the
    ``(schema, table)`` their events carry: the names as configured, which is how the
    runner recognises them (``public.dblog_signal`` by default, whatever the database).
    These events never reach the change log."""

    signal: tuple[str, str]
    watermark: tuple[str, str]
    signal_label: tuple[str, str]
    watermark_label: tuple[str, str]

    @property
    def qualified(self) -> frozenset[str]:
        return frozenset(f"{d}.{t}" for d, t in (self.signal, self.watermark))


def resolve_table(configured: str, database: str) -> tuple[str, str]:
    """``[snapshot] signal_table`` / ``watermark_table`` for MySQL: ``db.table``; a bare
    name or PostgreSQL's ``public.`` prefix means the captured database."""
    schema, _, table = configured.rpartition(".")
    if not schema or schema == PG_DEFAULT_SCHEMA:
        schema = database
    return schema, table


def own_tables(snapshot: SnapshotConfig, database: str) -> OwnTables:
    return OwnTables(
        resolve_table(snapshot.signal_table, database),
        resolve_table(snapshot.watermark_table, database),
        _label(snapshot.signal_table, database),
        _label(snapshot.watermark_table, database),
    )


def _label(configured: str, database: str) -> tuple[str, str]:
    schema, _, table = configured.rpartition(".")
    return (schema or database, table)


def _variables(cur: Any) -> dict[str, str]:
    cur.execute(
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
        "('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata', 'server_id')"
    )
    return {str(k).lower(): str(v) for k, v in cur.fetchall()}


def binlog_problems(cur: Any) -> list[str]:
    """Missing binlog settings, each with its fix."""
    v = _variables(cur)
    problems = []
    if v.get("log_bin", "OFF").upper() not in ("ON", "1"):
        problems.append("the binary log is off (log_bin): start the server with --log-bin")
    wanted = {"binlog_format": "ROW", "binlog_row_image": "FULL"}
    for name, value in wanted.items():
        got = v.get(name, "")
        if got.upper() != value:
            problems.append(
                f"{name} is {got or 'unset'}, must be {value}: "
                f"SET GLOBAL {name} = '{value}' and put {name}={value} in the server's config"
            )
    meta = v.get("binlog_row_metadata")
    # Servers without the setting (MySQL 5.7, 8.0 before 8.0.14) write no column names:
    # they come from information_schema (tablemap.py). Where it exists it must be FULL.
    if meta is not None and meta.upper() != "FULL":
        problems.append(
            f"binlog_row_metadata is {meta}, must be FULL: SET GLOBAL binlog_row_metadata = "
            "'FULL' and put binlog_row_metadata=FULL in the server's config"
        )
    return problems


def _current_grantee(cur: Any) -> str:
    cur.execute("SELECT CURRENT_USER()")
    user, _, host = str(cur.fetchone()[0]).rpartition("@")
    return f"'{user}'@'{host}'"


def privilege_problems(cur: Any, dsn: MySqlDsn) -> list[str]:
    """Missing grants (REPLICATION SLAVE, REPLICATION CLIENT, SELECT), each with its fix."""
    grantee = _current_grantee(cur)
    cur.execute(
        "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = %s",
        (grantee,),
    )
    glob = {str(r[0]).upper() for r in cur.fetchall()}
    cur.execute(
        "SELECT PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES "
        "WHERE GRANTEE = %s AND %s LIKE TABLE_SCHEMA",
        (grantee, dsn.database),
    )
    schema = {str(r[0]).upper() for r in cur.fetchall()}
    who = grantee.replace("'", "")
    problems = []
    if "REPLICATION SLAVE" not in glob:
        problems.append(
            f"{who} lacks REPLICATION SLAVE (to read the binlog): "
            f"GRANT REPLICATION SLAVE ON *.* TO {grantee}"
        )
    # MariaDB 10.5+ splits REPLICATION CLIENT into BINLOG MONITOR (and SLAVE MONITOR).
    if not glob & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        problems.append(
            f"{who} lacks REPLICATION CLIENT (to see the binlog position): "
            f"GRANT REPLICATION CLIENT ON *.* TO {grantee}"
        )
    if "SELECT" not in glob and "SELECT" not in schema:
        problems.append(
            f"{who} lacks SELECT on {dsn.database} (for snapshots): "
            f"GRANT SELECT ON {quote_ident(dsn.database)}.* TO {grantee}"
        )
    return problems


def check_source(conn: Any, dsn: MySqlDsn) -> None:
    """Raise one ``SourceError`` naming every missing setting and grant."""
    try:
        with conn.cursor() as cur:
            problems = binlog_problems(cur) + privilege_problems(cur, dsn)
    except pymysql.Error as exc:
        raise classify(exc, dsn, "the setup checks") from None
    if problems:
        raise SourceError(
            f"MySQL at {dsn.redacted} is not ready for capture:\n  - " + "\n  - ".join(problems),
            hint="see docs/mysql.md, 'Server setup'",
        )


def signal_table_ddl(tables: OwnTables) -> str:
    sig = ".".join(quote_ident(p) for p in tables.signal)
    return (
        f"CREATE TABLE IF NOT EXISTS {sig} (id VARCHAR(64) PRIMARY KEY, type VARCHAR(32) "
        "NOT NULL, data TEXT NULL) CHARACTER SET utf8mb4"
    )


def watermark_table_ddl(tables: OwnTables) -> str:
    wm = ".".join(quote_ident(p) for p in tables.watermark)
    return (f"CREATE TABLE IF NOT EXISTS {wm} (id INT PRIMARY KEY, value VARCHAR(64) NULL) "
            "CHARACTER SET utf8mb4")


def _table_exists(cur: Any, table: tuple[str, str]) -> bool:
    cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
                "TABLE_NAME = %s", table)
    return cur.fetchone() is not None


def ensure_own_tables(
    conn: Any, dsn: MySqlDsn, tables: OwnTables, *, read_only: bool = False
) -> None:
    """Create the signal table and the one-row watermark table if missing.

    ``read_only`` (``[snapshot] watermark = "read-only"``): create nothing (MySQL writes
    even ``CREATE TABLE IF NOT EXISTS`` of an existing table to the binlog); a missing
    signal table is only reported (signals then come from the CLI/HTTP only if the
    table exists: create it yourself)."""
    if read_only:
        _report_missing_signal_table(conn, dsn, tables)
        return
    wm = ".".join(quote_ident(p) for p in tables.watermark)
    statements = [
        signal_table_ddl(tables),
        watermark_table_ddl(tables),
        f"INSERT IGNORE INTO {wm} (id, value) VALUES (1, NULL)",
    ]
    try:
        with conn.cursor() as cur:
            # An existing table (an administrator's) is not created again: CREATE TABLE IF
            # NOT EXISTS needs the CREATE grant even then (and is written to the binlog).
            if _table_exists(cur, tables.signal):
                statements.remove(signal_table_ddl(tables))
            if _table_exists(cur, tables.watermark):
                statements.remove(watermark_table_ddl(tables))
            for sql in statements:
                cur.execute(sql)
    except pymysql.Error as exc:
        err = classify(exc, dsn, "creating pydblog's signal/watermark tables")
        raise SourceError(
            err.message,
            hint=f"create them yourself (docs/mysql.md) or GRANT CREATE, INSERT, UPDATE ON "
            f"{quote_ident(dsn.database)}.* TO the capture user",
        ) from None


def _report_missing_signal_table(conn: Any, dsn: MySqlDsn, tables: OwnTables) -> None:
    db, table = tables.signal
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
                "TABLE_NAME = %s",
                (db, table),
            )
            found = cur.fetchone() is not None
    except pymysql.Error as exc:
        raise classify(exc, dsn, "looking for the signal table") from None
    if not found:
        log.warning(
            'read-only snapshots: the signal table %s.%s does not exist and is not created '
            '(that would write to the source); to send signals through it, create it as a '
            "user allowed to: %s; and GRANT INSERT on it to whoever sends signals",
            db, table, signal_table_ddl(tables),
        )


def tables_without_key(conn: Any, database: str, names: list[str]) -> list[str]:
    if not names:
        return []
    with conn.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT TABLE_NAME FROM information_schema.KEY_COLUMN_USAGE "
            "WHERE TABLE_SCHEMA = %s AND CONSTRAINT_NAME = 'PRIMARY'",
            (database,),
        )
        keyed = {str(r[0]) for r in cur.fetchall()}
    return [n for n in names if n not in keyed]


def warn_keyless(conn: Any, database: str, names: list[str]) -> None:
    """Warn about each captured table of ``names`` without a primary key."""
    for t in tables_without_key(conn, database, names):
        log.warning(
            "table %s.%s has no primary key: its events are keyed by the whole row "
            "(rows that are equal in every column cannot be told apart) and a snapshot "
            "needs a surrogate key; add a primary key to capture it fully",
            database,
            t,
        )
