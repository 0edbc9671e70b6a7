"""The binlog stream yields ``Idle`` as soon as the connection has nothing more to read
(after a transaction, say), not only after ``idle_s``: the runner flushes its batch at
``Idle``, so a trickle of transactions reaches the change log without waiting for a
batch to age (the commit -> change log latency)."""

from __future__ import annotations

import threading
from typing import Any

from pydblog.devtools.mysql57 import TestServer
from pydblog.ports import Commit, Idle
from tests.mysql.helpers import make, run_sql


def test_idle_follows_a_transaction_before_the_idle_interval(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, _ = make(server, db)
    src.idle_s = 120.0  # the server's heartbeat and the wait: far beyond the test
    src.open(None)
    stream = src.stream()
    got: list[Any] = []
    done = threading.Event()

    def read() -> None:
        committed = False
        for item in stream:
            got.append(item)
            committed = committed or isinstance(item, Commit)
            if committed and isinstance(item, Idle):
                done.set()
                return

    try:
        run_sql(server, db, "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)")
        threading.Thread(target=read, daemon=True).start()
        assert done.wait(30), f"no Idle after the commit within 30 s: {got[-5:]}"
        after = got[next(i for i, x in enumerate(got) if isinstance(x, Commit)):]
        assert isinstance(after[-1], Idle)
    finally:
        src.close()
