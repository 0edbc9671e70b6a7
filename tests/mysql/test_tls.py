"""Connections share pymysql's default TLS context (``sources.mysql.connect.Connection``)
and still negotiate TLS where the server offers it, as pymysql alone does."""

from __future__ import annotations

from typing import Any

from pydblog.sources.mysql.connect import MySqlDsn, connect
from tests.mysql.helpers import commits, make, opened, read_until, run_sql
from tests.mysql.servers import Server


def _cipher(conn: Any) -> str:
    with conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        row = cur.fetchone()
    return str(row[1]) if row else ""


def test_one_tls_context_and_the_same_tls(server: Server, db: str) -> None:
    import pymysql

    dsn = MySqlDsn.parse(server.dsn(db))
    a, b = connect(dsn), connect(dsn)
    alone = pymysql.connect(**dsn.settings(timeout_s=5))
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db)
    _, reader = make(server, db)
    try:
        assert a.ctx is b.ctx  # built once
        assert alone.ctx is not a.ctx
        # TLS wherever pymysql alone uses it (MySQL 5.7 makes its own certificates).
        assert _cipher(a) == _cipher(b) == _cipher(alone)
        assert bool(_cipher(a)) == (type(server).__name__ == "MySQL57")
        reader.captured_tables()  # the table listing's own connection too
        assert reader._catalog.ctx is a.ctx
        assert reader._connection().ctx is a.ctx  # and the chunk reads' connection
        run_sql(server, db, "INSERT INTO t VALUES (1)")  # and the binlog dump's
        read_until(stream, commits(1))
        assert src._reader._stream_connection.ctx is a.ctx
    finally:
        for c in (a, b, alone):
            c.close()
        reader.close()
        src.close()
