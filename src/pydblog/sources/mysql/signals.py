"""Sending a snapshot signal to a MySQL/MariaDB source: a row in its signal table (the
running capture reads it back from the binlog, like any Debezium signal)."""

from __future__ import annotations

import pymysql

from pydblog.config import Config
from pydblog.errors import SourceError
from pydblog.sources.mysql.connect import MySqlDsn, classify, connect
from pydblog.sources.mysql.setup import own_tables
from pydblog.sources.mysql.types import quote_ident


def send_signal(cfg: Config, signal_id: str, kind: str, payload: str, *, once: bool = False) -> None:
    """Insert ``(signal_id, kind, payload)`` into the configured signal table (with
    ``once``: nothing if a signal with that id exists)."""
    dsn = MySqlDsn.parse(cfg.source.dsn)
    db, table = own_tables(cfg.snapshot, dsn.database).signal
    conn = connect(dsn, timeout_s=cfg.source.connect_timeout_s)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT {'IGNORE ' if once else ''}INTO {quote_ident(db)}.{quote_ident(table)} (id, type, data) "
                "VALUES (%s, %s, %s)",
                (signal_id, kind, payload),
            )
    except pymysql.Error as exc:
        err = classify(exc, dsn, f"writing the signal to {db}.{table}")
        raise SourceError(
            err.message,
            hint="start `dblog run` once (it creates the signal table) and grant INSERT on it",
        ) from None
    finally:
        conn.close()
