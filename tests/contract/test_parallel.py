"""Concurrent chunk windows (``[snapshot] parallelism = 4``, ``core.flight``) against a
real PostgreSQL: up to four chunks of 8,192 rows are read at once on four connections,
each in its own L/H window (read-only: its own fence), while a writer changes the table;
the oracle must hold, also across a kill -9 in the middle of the parallel chunks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.contract.test_snapshots import q, sid, writer

SETTINGS = "[snapshot]\nchunk_size = 8192\nparallelism = 4"


def big_table(h: PgHarness, rows: int) -> None:
    h.execute(
        "CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
        f"INSERT INTO t1 SELECT g, 'v' || g, g % 7 FROM generate_series(0, {rows - 1}) g",
    )


def test_parallel_chunks_with_writes(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    big_table(h, 30_000)
    with Capture(h, tmp_path, SETTINGS) as cap:
        stop = threading.Event()
        th = threading.Thread(target=writer, args=(h, "t1", stop, 7, 33_000))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            cap.wait_notification("COMPLETED", timeout=180)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    assert len(snapshot_rows(events, "t1")) > 20_000
    assert "up to 4 read at once" in err


@pytest.mark.slow
def test_parallel_chunks_resume_after_kill9(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    big_table(h, 40_000)
    cap = Capture(h, tmp_path, SETTINGS).start()
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(h, "t1", stop, 8, 44_000))
    th.start()
    try:
        h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
        cap.wait_notification("IN_PROGRESS", count=2)
        cap.kill()
        cap.start()
        cap.wait_notification("COMPLETED", timeout=180)
    finally:
        stop.set()
        th.join()
    events = cap.assert_oracle({"t1": ["id"]})
    assert "up to 4 read at once" in cap.stop()
    assert sum(1 for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED") == 1
