"""A signal while a chunk read waits on the server (for a table lock another session
holds) must not stall the stream (the MySQL twin: tests/mysql/test_signal_during_chunk.py).
PostgreSQL's captured tables come from the log source's own list, never from the chunk
reader's connection, so the capture thread does not wait behind the read."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.helpers import sid, wait_for


def test_a_signal_while_a_chunk_read_waits_does_not_stall_the_stream(
    pg_db: str, tmp_path: Path
) -> None:
    h = PgHarness(pg_db)
    h.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)",
              "INSERT INTO t1 VALUES (1, 'a'), (2, 'b'), (3, 'c')",
              "CREATE TABLE t2 (id int PRIMARY KEY, v text)")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 2\nparallelism = 1") as cap:
        cap.caught_up()
        with psycopg.connect(pg_db) as holder:
            holder.execute("LOCK TABLE t1 IN ACCESS EXCLUSIVE MODE")  # t1's reads wait
            h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.t1"]})
            wait_for(lambda: lock_waiters(pg_db) > 0, 30, "a reader waiting for t1's lock")
            h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.t2"]})
            h.execute("INSERT INTO t2 VALUES (1, 'after the signal')")
            cap.wait_until(lambda ev: any((e.get("after") or {}).get("v") == "after the signal"
                                          for e in ev), 30, "the t2 row while t1's read waits")
            holder.rollback()
        cap.wait_notification("COMPLETED")  # one: the second signal joins the first snapshot
        cap.assert_oracle({"t1": ["id"], "t2": ["id"]})


def lock_waiters(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted "
                           "AND relation = 'public.t1'::regclass").fetchone()
    return int(row[0]) if row else 0
