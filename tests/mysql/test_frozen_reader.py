"""A reader that stops reading (a frozen HA leader) must not hold up the next reader of
the same ``server_id``: the server would keep the new dump silent while the old one is
blocked writing to the frozen reader's full socket (``sources/mysql/dumpconn.py``)."""

from __future__ import annotations

import time

from pydblog.devtools.mysql57 import TestServer
from pydblog.ports import Checkpoint, SourceState
from pydblog.sources.mysql.dumpconn import DUMP_CONNECTION_KEY
from tests.mysql.helpers import changes, opened, read_until, run_sql

BLOCKED = ("Writing to net", "Sending to client")  # MariaDB, MySQL 5.7


def _dump_threads(server: TestServer) -> list[tuple[int, str]]:
    return [(int(r[0]), str(r[1])) for r in server.execute(
        "SELECT id, state FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%'")]


def test_a_frozen_readers_dump_does_not_hold_up_the_next(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v LONGTEXT)", db)
    frozen, stream = opened(server, db)
    try:
        run_sql(server, db, "INSERT INTO t (v) VALUES ('first')")
        items = read_until(stream, lambda got: bool(changes(got)))
        first = changes(items)[0]
        record = [i.value for i in items
                  if isinstance(i, SourceState) and i.key == DUMP_CONNECTION_KEY]
        assert len(record) == 1, items
        # The frozen reader reads no more: its dump thread fills the socket and blocks.
        for _ in range(60):
            run_sql(server, db, "INSERT INTO t (v) VALUES (REPEAT('x', 100000))")
        deadline = time.monotonic() + 15
        while not any(state in BLOCKED for _, state in _dump_threads(server)):
            assert time.monotonic() < deadline, _dump_threads(server)
            time.sleep(0.1)
        run_sql(server, db, "INSERT INTO t (v) VALUES ('marker')")
        # The next reader resumes from the frozen one's checkpoint (as a new HA leader).
        checkpoint = Checkpoint(first.position, extra={DUMP_CONNECTION_KEY: record[0]})
        nxt, again = opened(server, db, checkpoint)
        try:
            # Within the stream's read timeout (30 s): no silent dump, no reconnect.
            got = read_until(again, lambda got: any(
                (e.after or {}).get("v") == "marker" for e in changes(got)), timeout=25)
        finally:
            nxt.close()
        values = [e.after["v"] for e in changes(got) if e.after]
        assert len(values) == 61 and values[-1] == "marker"  # each once, in order
        assert record[0]["id"] not in [i for i, _ in _dump_threads(server)]
    finally:
        frozen.close()
