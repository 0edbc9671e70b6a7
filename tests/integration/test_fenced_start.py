"""A watermark snapshot's table start (its max key) is read fenced, as a read-only one's.

A table's start reads its max key, the snapshot's upper bound: rows beyond it must reach
the change log through the stream. Rows whose events the stream never carries (written
before the table joined the publication, or before the slot) come only from the
snapshot, so the max key must see them. With a synchronous standby a commit can be
decoded (its record flushed) yet stay invisible while it waits for the standby's
acknowledgement; a max key read meanwhile misses its rows. Read-only snapshots read the
start fenced (for a lagging hot standby); watermark snapshots (the default) read it
fenced too: read plainly, they would lose those rows for good.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.integration.test_late_visible_commit import sync_cluster, sync_db  # noqa: F401


def test_a_watermark_snapshot_start_waits_for_a_commit_that_is_not_visible_yet(
    sync_db: str, tmp_path: Path  # noqa: F811 - the fixture
) -> None:
    h = PgHarness(sync_db)
    h.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)", "INSERT INTO t1 VALUES (1, 'a')")
    extra = '[snapshot]\nmode = "initial"\nchunk_size = 50\nadaptive = false'
    with Capture(h, tmp_path, extra) as c1:  # the slot, the publication, t1's snapshot
        c1.wait_notification("COMPLETED")
    # Created while the capture is down: not in the publication, its rows in no event.
    h.execute("CREATE TABLE t2 (id int PRIMARY KEY, v text)",
              "INSERT INTO t2 SELECT g, 'early' FROM generate_series(1, 200) g")
    stuck = psycopg.connect(h.dsn)
    stuck.execute("SET synchronous_commit = on")
    stuck.execute("INSERT INTO t2 SELECT g, 'late' FROM generate_series(201, 300) g")
    committing = threading.Thread(target=stuck.commit)
    committing.start()  # flushed, decoded, and waits for the standby: invisible
    pid = stuck.info.backend_pid
    cap: Capture | None = None
    try:
        with psycopg.connect(h.dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                               (pid,)).fetchone() != ("SyncRep",):
                assert time.monotonic() < deadline, "the insert does not wait for the standby"
                time.sleep(0.05)
            row = conn.execute("SELECT count(*) FROM t2").fetchone()
            assert row == (200,), "the stuck insert is visible"
        cap = Capture(h, tmp_path, extra)  # the same log and slot
        mark = cap.end()  # (t1's COMPLETED is in the log)
        cap.start()
        try:
            # Restarted with mode initial, t2 (outside the publication) is snapshotted
            # alone; its start is read while the insert is invisible (and, wrongly, kept).
            cap.caught_up()
            time.sleep(2)
        finally:
            with psycopg.connect(h.dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_cancel_backend(%s)", (pid,))  # commits locally
            committing.join(30)
            stuck.close()
        cap.wait_notification("COMPLETED", timeout=60, after=mark)
        events = cap.assert_oracle({"t1": ["id"], "t2": ["id"]})
    finally:
        if cap is not None and cap.proc is not None:
            cap.stop()
    assert len(snapshot_rows(events, "t2")) == 300
