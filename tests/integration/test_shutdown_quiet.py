"""`dblog run` stopped (SIGTERM) while a snapshot chunk read is in progress on the
server: the capture closes the reader's connections under the read (``closing``), and
the read fails. That failure is dblog's own doing, not the server's: the shutdown must
not log it as one (before: "snapshot request for public.sq failed: ... server closed
the connection unexpectedly", a warning an operator reads as a server crash)."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.helpers import sid


def test_stop_during_a_chunk_read_logs_no_server_error(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    h.execute("CREATE TABLE sq (id int PRIMARY KEY, v text)",
              "INSERT INTO sq SELECT g, 'v' || g FROM generate_series(1, 50) g")
    cap = Capture(h, tmp_path, "[snapshot]\nchunk_size = 10\nadaptive = false").start()
    try:
        h.signal(sid(), "execute-snapshot", {
            "data-collections": ["public\\.sq"],
            "additional-conditions": [{"data-collection": "public.sq",
                                       "filter": "id <> 5 OR pg_sleep(60) IS NOT NULL"}],
        })
        with psycopg.connect(h.dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 60
            while not watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                "AND query LIKE '%%sq%%'"
            ).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the chunk read never reached its sleep"
                time.sleep(0.05)
        err = cap.stop()  # exit code 0, no traceback
    finally:
        if cap.proc is not None:
            cap.kill()
    assert "server closed the connection" not in err, err[-3000:]
    assert "failed" not in err, err[-3000:]
