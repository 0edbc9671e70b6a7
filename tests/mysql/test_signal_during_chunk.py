"""A signal while a chunk read waits on the server (here: for a table lock another
session holds) must not stall the stream. Without ``[snapshot] read_dsn`` the captured
tables were listed on the chunk reader's connection, under its lock: the capture thread
(which lists them for every signal) waited behind the chunk read, up to
``statement_timeout_ms``, and no change reached the log meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydblog.devtools.mysql57 import TestServer
from tests.contract.capture import Capture
from tests.helpers import sid, wait_for
from tests.mysql.harness import MariaHarness


@pytest.mark.parametrize("server", ["mariadb"], indirect=True)
def test_a_signal_while_a_chunk_read_waits_does_not_stall_the_stream(
    server: TestServer, db: str, tmp_path: Path
) -> None:
    h = MariaHarness(server, db)
    h.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(40))",
              "INSERT INTO t1 VALUES (1, 'a'), (2, 'b'), (3, 'c')",
              "CREATE TABLE t2 (id INT PRIMARY KEY, v VARCHAR(40))")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 2\nparallelism = 1") as cap:
        cap.caught_up()
        with server.admin(db) as holder:
            holder.execute("LOCK TABLES t1 WRITE")  # the snapshot's reads of t1 wait
            h.signal(sid(), "execute-snapshot", {"data-collections": [f"{db}\\.t1"]})
            wait_for_lock_waiter(server, db)
            h.signal(sid(), "execute-snapshot", {"data-collections": [f"{db}\\.t2"]})
            h.execute("INSERT INTO t2 VALUES (1, 'after the signal')")
            cap.wait_until(lambda ev: any((e.get("after") or {}).get("v") == "after the signal"
                                          for e in ev), 30, "the t2 row while t1's read waits")
            holder.execute("UNLOCK TABLES")

        cap.wait_notification("COMPLETED")  # one: the second signal joins the first snapshot
        cap.assert_oracle({"t1": ["id"], "t2": ["id"]})


def wait_for_lock_waiter(server: TestServer, db: str) -> None:
    """Until a session of ``db`` waits for the table lock (the chunk reader's)."""

    def waiting() -> bool:
        with server.admin() as cur:
            cur.execute("SELECT count(*) FROM information_schema.processlist "
                        "WHERE db = %s AND state LIKE %s", (db, "%metadata lock%"))
            rows = cur.fetchall()
        return bool(rows and rows[0][0])

    wait_for(waiting, 30, "a reader waiting for the table lock")
