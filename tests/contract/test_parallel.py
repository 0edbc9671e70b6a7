"""Concurrent chunk windows (``[snapshot] parallelism = 4``, ``core.flight``) against a
real PostgreSQL: up to four chunks of 8,192 rows are read at once on four connections,
each in its own L/H window (read-only: its own fence), while a writer changes the table;
the oracle must hold, also across a kill -9 in the middle of the parallel chunks."""

from __future__ import annotations

import random
import threading
import time
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
    cap.stop()
    assert sum(1 for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED") == 1


@pytest.mark.slow
@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_parallel_chunks_survive_kill9_at_random_points(
    pg_db: str, tmp_path: Path, watermark: str
) -> None:
    """Three kill -9s at random moments while four windows are in flight (some read,
    some waiting for their H or fence, some waiting for an earlier range), under a
    write load; every restart resumes after the emitted prefix, and the change log
    materializes to the table."""
    h = PgHarness(pg_db)
    big_table(h, 120_000)
    rng = random.Random(watermark)
    settings = f'[snapshot]\nchunk_size = 512\nparallelism = 4\nwatermark = "{watermark}"'
    with Capture(h, tmp_path, settings) as cap:
        stop = threading.Event()
        th = threading.Thread(target=writer, args=(h, "t1", stop, 11, 130_000))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            cap.wait_notification("IN_PROGRESS")
            mid = 0  # kills before the snapshot completed
            for _ in range(3):
                time.sleep(rng.uniform(0.1, 0.8))
                mid += not any(
                    e["op"] == "n" and e["notification"]["type"] == "COMPLETED"
                    for e in cap.events()
                )
                cap.kill()
                cap.start()
            cap.wait_notification("COMPLETED", timeout=240)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"t1": ["id"]})
        cap.stop()
    assert mid >= 2
    completed = [e for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED"]
    assert len(completed) == 1
