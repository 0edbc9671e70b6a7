"""Which running transactions a primary's fence doubts, with a synchronous standby.

With ``synchronous_standby_names`` set, a commit the stream delivered can still be
invisible (it waits for the standby's acknowledgement), so a fenced read (read-only
snapshots, and watermark chunks on PostgreSQL 13+) must know which transactions the
stream delivered and its snapshot does not see. After each start of ``dblog run`` the
core does not know what was delivered before it, and resolves that at the first fence.
Only a transaction that is *committing* (its backend waits for the standby:
``pg_stat_activity.wait_event = 'SyncRep'``) can have been delivered and be invisible;
one still executing a statement, or an orphaned prepared transaction (``PREPARE
TRANSACTION``, never committed), has no commit record yet, and must not hold every
snapshot for as long as it lives. Telling them apart needs the wait states of other
roles' sessions (``pg_read_all_stats``): a capture role without it gets a clear error
naming the grant instead of a snapshot that silently never finishes.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.contract.test_read_only_signals import PgReadOnlyUser
from tests.helpers import sid
from tests.integration.test_late_visible_commit import sync_cluster, sync_db  # noqa: F401

DECIDED_S = 60
"""A fixed snapshot finishes in seconds; an unfixed one waits for the blocker (never)."""


def _tables(h: PgHarness) -> None:
    h.execute(
        "CREATE TABLE t1 (id int PRIMARY KEY, v text)",
        "INSERT INTO t1 SELECT g, 'old' FROM generate_series(1, 300) g",
        "CREATE TABLE other (id int)",
    )


@contextlib.contextmanager
def executing(dsn: str) -> Iterator[None]:
    """A transaction holding an xid that executes a long statement (a batch job):
    'active', not committing. Cancelled (rolled back) on exit."""
    conn = psycopg.connect(dsn)
    started = threading.Event()

    def run() -> None:
        conn.execute("INSERT INTO other VALUES (1)")
        started.set()
        with contextlib.suppress(psycopg.Error):
            conn.execute("SELECT pg_sleep(600)")

    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        assert started.wait(30)
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_cancel_backend(%s)", (conn.info.backend_pid,))
        th.join(30)
        conn.close()


@contextlib.contextmanager
def prepared(dsn: str) -> Iterator[None]:
    """An orphaned prepared transaction (PREPARE TRANSACTION, never committed): its
    xid stays running, held by no backend. Rolled back on exit."""
    gid = f"orphan-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO other VALUES (2)")
        conn.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"ROLLBACK PREPARED '{gid}'")


@pytest.mark.parametrize("blocker", ["executing", "prepared"])
@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_a_transaction_that_is_not_committing_does_not_hold_the_first_fence(
    sync_db: str, tmp_path: Path, watermark: str, blocker: str  # noqa: F811 - the fixture
) -> None:
    """The blocker is open (with an xid, not committing) at the first fenced read after
    the start, and stays open until the snapshot has finished."""
    h = PgHarness(sync_db)
    _tables(h)
    extra = f'[snapshot]\nchunk_size = 100\nadaptive = false\nwatermark = "{watermark}"'
    block = executing if blocker == "executing" else prepared
    with Capture(h, tmp_path, extra) as cap:
        cap.caught_up()  # (the slot's creation waits for transactions with an xid)
        with block(sync_db):
            h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.t1"]})
            cap.wait_notification("COMPLETED", timeout=DECIDED_S)
        cap.assert_oracle({"t1": ["id"]})


def test_a_capture_role_without_pg_read_all_stats_is_told_the_grant(
    sync_db: str, tmp_path: Path  # noqa: F811 - the fixture
) -> None:
    """Other roles' wait states are hidden from a role without ``pg_read_all_stats``,
    so its fences cannot tell a committing transaction from an idle or executing one:
    the snapshot is rejected with the grant to add (it used to back off for as long as
    another role's session held an xid). With the grant, the same snapshot finishes."""
    inner = PgHarness(sync_db)
    _tables(inner)
    ro = PgReadOnlyUser(inner)
    extra = '[snapshot]\nchunk_size = 100\nadaptive = false\nwatermark = "read-only"'
    blocker = psycopg.connect(sync_db)  # the administrator's session, idle in transaction
    try:
        with Capture(ro, tmp_path, extra) as cap:
            cap.caught_up()
            blocker.execute("INSERT INTO other VALUES (1)")
            inner.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.t1"]})
            cap.wait_notification("REJECTED", timeout=DECIDED_S)
            (rejected,) = cap.notifications("REJECTED")
            text = str(rejected["notification"])
            assert "pg_read_all_stats" in text and f"GRANT pg_read_all_stats TO {ro.user}" in text, text
            inner.execute(f"GRANT pg_read_all_stats TO {ro.user}")
            mark = cap.end()  # (the rejected snapshot's COMPLETED is in the log)
            inner.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.t1"]})
            cap.wait_notification("COMPLETED", timeout=DECIDED_S, after=mark)
            assert blocker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            cap.assert_oracle({"t1": ["id"]})
    finally:
        blocker.close()
