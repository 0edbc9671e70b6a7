"""Fenced snapshots stay live while a transaction the stream never delivered is open.

PostgreSQL 13+ reads watermark chunks fenced (the default ``watermark = "table"``): the
core keeps the events no fence has shown visible, and after a restart it keeps what it
lost of them (``core.fence.Lost``). An idle-in-transaction session holding an xid (common
in production: a forgotten ``BEGIN`` in a console, a connection pool's leaked session)
is running for as long as it lives; it was never delivered, so it must not keep a
snapshot from deciding its windows. Judging the lost events by ``xmin`` did: every read's
``xmin`` stays at the blocker's xid, below the lost events', and the snapshot re-read its
first chunk forever (0 rows after 60 s, ~445 transactions/s against the source).
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from pydblog.changelog import open_reader
from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.helpers import sid
from tests.integration.test_late_visible_commit import sync_cluster, sync_db  # noqa: F401

ROWS = 1200


@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_a_restarted_snapshot_finishes_while_an_undelivered_transaction_stays_open(
    pg_db: str, tmp_path: Path, watermark: str
) -> None:
    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE t1 (id int PRIMARY KEY, v text)",
        f"INSERT INTO t1 SELECT g, 'old' FROM generate_series(1, {ROWS}) g",
        "CREATE TABLE other (id int)",
    )
    extra = f'[snapshot]\nchunk_size = 100\nadaptive = false\nwatermark = "{watermark}"'
    cap = Capture(h, tmp_path, extra).start()
    blocker = psycopg.connect(pg_db)
    try:
        cap.caught_up()
        # Idle in transaction with an xid, older than every update below: never delivered.
        blocker.execute("INSERT INTO other VALUES (1)")
        with psycopg.connect(pg_db) as conn:  # one transaction: paused before it completes
            for kind, data in (("execute-snapshot", '{"data-collections": ["public\\\\.t1"]}'),
                               ("pause-snapshot", "{}")):
                conn.execute("INSERT INTO dblog_signal (id, type, data) VALUES (%s, %s, %s)",
                             (sid(), kind, data))
        cap.wait_notification("PAUSED")
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for i in range(1, ROWS + 1, 7):
                conn.execute("UPDATE t1 SET v = 'new' WHERE id = %s", (i,))
        cap.caught_up()
        # The updates' events are unsettled (kept by the core), and persisted as lost.
        deadline = time.monotonic() + 30
        while "unsettled" not in _state(cap):
            assert time.monotonic() < deadline, "the unsettled events were never checkpointed"
            time.sleep(0.2)
        assert not cap.notifications("COMPLETED")
        cap.kill()
        cap.start()
        h.signal(sid(), "resume-snapshot", {})
        # Bound generous for a loaded machine: it finishes in seconds with the fix, and
        # never while the blocker is open without it.
        cap.wait_notification("COMPLETED", timeout=90)
        assert blocker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        blocker.close()
    cap.assert_oracle({"t1": ["id"]})
    cap.stop()


@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_a_snapshot_with_a_synchronous_standby_finishes_while_a_session_idles_in_a_transaction(
    sync_db: str, tmp_path: Path, watermark: str  # noqa: F811 - the fixture
) -> None:
    """With ``synchronous_standby_names`` set, a start's first read
    resolves what the stream delivered before it conservatively (every transaction
    running and unseen), and an idle-in-transaction session's xid held every later floor
    until the session ended. It was never delivered: a backend idle in its transaction
    is not committing, so its xids are not in doubt (``RUNNING_SQL``)."""
    h = PgHarness(sync_db)
    h.execute(
        "CREATE TABLE t1 (id int PRIMARY KEY, v text)",
        "INSERT INTO t1 SELECT g, 'old' FROM generate_series(1, 300) g",
        "CREATE TABLE other (id int)",
    )
    extra = f'[snapshot]\nchunk_size = 100\nadaptive = false\nwatermark = "{watermark}"'
    blocker = psycopg.connect(sync_db)
    try:
        with Capture(h, tmp_path, extra) as cap:
            cap.caught_up()  # (the slot's creation waits for transactions with an xid)
            blocker.execute("INSERT INTO other VALUES (1)")  # an xid, idle in transaction
            h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.t1"]})
            cap.wait_notification("COMPLETED", timeout=90)
            assert blocker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            blocker.rollback()
            cap.assert_oracle({"t1": ["id"]})
    finally:
        blocker.close()


def _state(cap: Capture) -> dict[str, object]:
    """The snapshot state of the change log's last checkpoint ({} if none)."""
    reader = open_reader(cap.log_cfg)
    try:
        checkpoint = reader.last_checkpoint()
    finally:
        reader.close()
    return (checkpoint.snapshot if checkpoint is not None else None) or {}
