"""Sending snapshot signals: a row in the source's signal table (the running capture
reads it from the log, like any Debezium signal)."""

from __future__ import annotations

from typing import Any

import orjson

from pydblog.config import Config
from pydblog.errors import SourceError
from pydblog.extras import needs_extra


def send_signal(
    cfg: Config, signal_id: str, kind: str, data: dict[str, Any], *, once: bool = False
) -> None:
    """Insert the signal row; with ``once`` nothing happens if a signal with that id
    exists (the Kafka signal channel forwards at least once)."""
    payload = orjson.dumps(data).decode()
    if cfg.source.type == "postgres":
        import psycopg
        from psycopg import sql

        from pydblog.sources.postgres.connect import connect
        from pydblog.sources.postgres.setup import split_name

        conn = connect(cfg.source.dsn, timeout_s=cfg.source.connect_timeout_s)
        try:
            schema, table = split_name(cfg.snapshot.signal_table)
            conn.execute(
                sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s){}").format(
                    sql.Identifier(schema, table),
                    sql.SQL(" ON CONFLICT (id) DO NOTHING" if once else ""),
                ),
                (signal_id, kind, payload),
            )
        except psycopg.Error as exc:
            raise SourceError(
                f"cannot write the signal to {cfg.snapshot.signal_table}: {str(exc).strip()}",
                hint="start `dblog run` once (it creates the signal table) and grant INSERT on it",
            ) from None
        finally:
            conn.close()
        return
    with needs_extra("mysql", 'source type "mysql"'):
        from pydblog.sources.mysql.signals import send_signal as send_mysql

    send_mysql(cfg, signal_id, kind, payload, once=once)
