"""Result sets of every column type read from a real server (MariaDB and MySQL 5.7): the
C row parser (``textrows``) gives PyMySQL's own rows, value for value and type for type."""

from __future__ import annotations

from typing import Any

import pytest

from pydblog.devtools.mysql57 import TestServer
from pydblog.sources.mysql import textrows
from tests.mysql.test_types import COLUMNS, ROWS

pytestmark = pytest.mark.skipif(textrows.module() is None, reason="_mytext not built")


def _read(server: TestServer, db: str, sql: str) -> list[tuple[Any, ...]]:
    return server.execute(sql, db)


def test_every_type_reads_as_pymysql_reads_it(server: TestServer, db: str) -> None:
    server.execute(f"CREATE TABLE types ({COLUMNS})", db)
    for values, _ in ROWS:
        server.execute(f"INSERT INTO types VALUES {values}", db)
    queries = ["SELECT * FROM types ORDER BY id",
               "SELECT id, d + 0, f + 0e0, b + 0, CAST(j AS CHAR), NULL, '' FROM types ORDER BY id"]
    textrows.uninstall()
    try:
        theirs = [_read(server, db, q) for q in queries]
    finally:
        assert textrows.install()
    ours = [_read(server, db, q) for q in queries]
    assert len(ours[0]) == len(ROWS)
    for a, b in zip(theirs, ours, strict=True):
        assert [[type(v) for v in r] for r in a] == [[type(v) for v in r] for r in b]
        assert a == b
