"""``sources.mysql.wake.Wakeup`` on real connections, with and without TLS (MySQL 5.7
negotiates TLS by default and pymysql takes it: its binlog stream then runs over an
``SSLSocket``). ``wait`` must tell "nothing to read" from "cannot tell" there too: a
``wait`` that answered "readable" on every TLS socket blocked in the read, so a chunk
answer or a change log writer's wakeup waited for the server's next heartbeat."""

from __future__ import annotations

import ssl
import time

from pymysql.constants import COMMAND

from pydblog.devtools.mysql57 import MySQL57
from pydblog.sources.mysql.connect import MySqlDsn, connect
from pydblog.sources.mysql.wake import Wakeup
from tests.mysql.servers import Server


def test_wait_tells_woken_idle_and_readable_apart(server: Server, db: str) -> None:
    conn = connect(MySqlDsn.parse(server.dsn(db)))
    try:
        tls = isinstance(conn._sock, ssl.SSLSocket)
        assert tls == isinstance(server, MySQL57), "MySQL 5.7 negotiates TLS, MariaDB here not"
        wake = Wakeup()
        assert wake.wait(conn, 0.05) is False  # nothing to read: after the timeout
        wake.set()
        t0 = time.monotonic()
        assert wake.wait(conn, 30) is False  # woken, at once: not after the timeout
        assert time.monotonic() - t0 < 10  # (a liveness bound, generous under load)
        conn._execute_command(COMMAND.COM_QUERY, "SELECT 1")
        assert wake.wait(conn, 30) is True  # the answer is readable
        conn._read_query_result()
        assert wake.wait(conn, 0.05) is False  # read: nothing left
    finally:
        conn.close()
