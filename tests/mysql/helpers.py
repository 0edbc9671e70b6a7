"""Helpers for the MySQL source tests: configs, opening a source, reading its stream."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from pydblog.config import Config, parse_config
from pydblog.devtools.mysql57 import TestServer
from pydblog.events import ChangeEvent
from pydblog.ports import Checkpoint, Commit
from pydblog.sources.mysql.binlog import MySqlLogSource
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from pydblog.sources.mysql.factory import create
from pydblog.sources.mysql.position import BinlogPosition


def config(server: TestServer, db: str, **source: Any) -> Config:
    data: dict[str, Any] = {
        "source": {"type": "mysql", "dsn": server.dsn(db), "server_id": 4242, **source},
    }
    return parse_config(data)


def make(server: TestServer, db: str, **source: Any) -> tuple[MySqlLogSource, MySqlSnapshotReader]:
    src, reader = create(config(server, db, **source))
    assert isinstance(src, MySqlLogSource) and isinstance(reader, MySqlSnapshotReader)
    return src, reader


def opened(
    server: TestServer, db: str, checkpoint: Checkpoint | None = None, **source: Any
) -> tuple[MySqlLogSource, Iterator[Any]]:
    src, _ = make(server, db, **source)
    src.open(checkpoint)
    return src, src.stream()


def read_until(
    stream: Iterator[Any], done: Callable[[list[Any]], bool], timeout: float = 15.0
) -> list[Any]:
    """Items from ``stream`` until ``done(items)`` (AssertionError at the timeout)."""
    items: list[Any] = []
    deadline = time.monotonic() + timeout
    for item in stream:
        items.append(item)
        if done(items):
            return items
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"timed out; got {items[-20:]}")


def commits(n: int) -> Callable[[list[Any]], bool]:
    return lambda items: sum(isinstance(i, Commit) for i in items) >= n


def changes(items: list[Any]) -> list[ChangeEvent]:
    return [i for i in items if isinstance(i, ChangeEvent)]


def run_sql(server: TestServer, db: str, *statements: str) -> None:
    """Statements in one transaction."""
    conn = server.connect(db)
    try:
        conn.autocommit(False)
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
        conn.commit()
    finally:
        conn.close()


def bpos(position: object) -> BinlogPosition:
    assert isinstance(position, BinlogPosition)
    return position
