"""Sending snapshot signals: a row in the source's signal table (the running capture
reads it from the log, like any Debezium signal), or, for read-only snapshots, straight
to the running capture (``signals_go_direct``, ``capture.inbox``)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson
import psycopg
from psycopg import sql

from pydblog.apiaddress import API_FILE, read_api_address
from pydblog.config import Config
from pydblog.errors import ConfigError, SourceError, SourceUnavailable
from pydblog.extras import needs_extra
from pydblog.sources.postgres.connect import connect
from pydblog.sources.postgres.setup import split_name


def signals_go_direct(cfg: Config) -> bool:
    """Read-only snapshots write nothing to the source, so signals from the API, the
    Kafka signal channel and ``dblog snapshot`` go to the running capture itself
    (``capture.inbox``) instead of the signal table (which still works if the user
    created it and can write it)."""
    return cfg.snapshot.watermark == "read-only"


def send_signal(
    cfg: Config, signal_id: str, kind: str, data: dict[str, Any], *, once: bool = False
) -> None:
    """Insert the signal row; with ``once`` nothing happens if a signal with that id
    exists (the Kafka signal channel forwards at least once)."""
    payload = orjson.dumps(data).decode()
    if cfg.source.type == "postgres":
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


def post_signal(cfg: Config, signal_id: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """Read-only snapshots: send the signal to the running capture's API (``POST
    /snapshots``, which answers once the signal is applied); returns its answer."""
    url = read_api_address(cfg.log_dir)
    if url is None:
        raise ConfigError(
            f"read-only snapshots take signals through the running capture, and no "
            f"`dblog run` API is recorded in {cfg.log_dir / API_FILE}",
            hint="start `dblog run` with [api] listen set (the default), or send the signal "
                 "to [snapshot] signal_topic, or create the signal table and INSERT it yourself",
        )
    if not cfg.api.token:
        raise ConfigError(
            "read-only snapshots take signals through the capture's API, which needs a token",
            hint="set [api] token (16+ characters) in the config of `dblog run` and here",
        )
    body = orjson.dumps({"id": signal_id, "type": kind, "data": data})
    req = urllib.request.Request(
        f"{url}/snapshots", data=body, method="POST",
        headers={"Authorization": f"Bearer {cfg.api.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer: dict[str, Any] = orjson.loads(resp.read())
            return answer
    except urllib.error.HTTPError as exc:
        try:
            doc = orjson.loads(exc.read())
        except orjson.JSONDecodeError:
            doc = {}
        raise SourceError(
            f"the capture's API at {url} refused the signal ({exc.code}): "
            f"{doc.get('error', exc.reason)}",
            hint=doc.get("hint"),
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceUnavailable(
            f"cannot reach the capture's API at {url}: {reason}",
            hint="is `dblog run` running? (`dblog status`)",
        ) from None
