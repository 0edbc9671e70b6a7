"""A commit the stream delivers before it becomes visible, during a watermark snapshot.

PostgreSQL decodes a commit once its record is flushed; the transaction becomes visible
to other sessions only later (after its clog update and ProcArray exit, and after a
synchronous standby's acknowledgement). A chunk whose low watermark L is committed
after such a commit record, but whose SELECT runs while the transaction is still
invisible, reads the row *older* than the event the stream delivered before L: DBLog's
window (which only drops keys of events between L and H) then places the stale row
after the newer event, and the log materializes the old value for good ("time travel").
It was seen as `tests/integration/test_recreate.py` failing under CPU load (the gap is
a few microseconds there); a synchronous standby that never answers makes it as long
as the test wants, so this test forces it every time: one UPDATE waits for the standby
(decoded, logged, invisible) while the snapshot reads its key, then is released.
A blocking snapshot read during such a wait, with the stream paused after the commit
(no L orders the read), is fenced too:
``test_blocking_snapshot_during_a_commit_held_for_a_synchronous_standby``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pydblog.devtools.pgcluster import PgCluster
from tests.conftest import drop_database
from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.helpers import sid, wait_for


@pytest.fixture(scope="module")
def sync_cluster() -> Iterator[PgCluster]:
    """A cluster whose commits wait for a standby that never comes, unless the session
    says ``synchronous_commit = local`` (the default here: only the test's stuck writer
    asks for the standby)."""
    cluster = PgCluster(settings={
        "synchronous_standby_names": "'ghost'", "synchronous_commit": "local",
        "max_prepared_transactions": "4",  # (tests/integration/test_fence_doubt.py)
    }).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def sync_db(sync_cluster: PgCluster) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    dsn = sync_cluster.create_database(name)
    try:
        yield dsn
    finally:
        drop_database(sync_cluster, name)  # and its slot: slot names are cluster-wide


@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_commit_decoded_before_it_is_visible(
    sync_db: str, tmp_path: Path, watermark: str
) -> None:
    h = PgHarness(sync_db)
    h.execute(
        "CREATE TABLE lv (id int PRIMARY KEY, v text)",
        "INSERT INTO lv SELECT g, 'old' FROM generate_series(1, 5000) g",
    )
    extra = f'[snapshot]\nchunk_size = 100\nadaptive = false\nwatermark = "{watermark}"'
    h.execute("CREATE TABLE warm (id int PRIMARY KEY)", "INSERT INTO warm VALUES (1)")
    with Capture(h, tmp_path, extra) as cap:
        # A first snapshot: its reads' fences show that no transaction delivered before
        # the capture started is still invisible (until one does, the floor of a table's
        # snapshot is judged conservatively: see docs/snapshots.md, read-only snapshots).
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.warm"]})
        cap.wait_notification("COMPLETED")
        mark = cap.end()
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.lv"]})
        h.signal(sid(), "pause-snapshot", {})
        cap.wait_notification("PAUSED")
        key = 4990  # in a chunk the paused snapshot has not read yet
        assert not any(e["op"] == "r" and e["key"]["id"] > 4000 for e in cap.events())
        stuck = psycopg.connect(h.dsn)
        stuck.execute("SET synchronous_commit = on")
        stuck.execute("UPDATE lv SET v = 'new' WHERE id = %s", (key,))
        pid = stuck.info.backend_pid
        committing = threading.Thread(target=stuck.commit)
        committing.start()
        try:
            # The commit is decoded and logged while it waits for the standby...
            cap.wait_until(lambda ev: any(e["op"] == "u" and e["key"] == {"id": key} for e in ev),
                           timeout=60, what="the stuck update in the log")
            with psycopg.connect(h.dsn, autocommit=True) as conn:  # ...yet invisible
                row = conn.execute("SELECT v FROM lv WHERE id = %s", (key,)).fetchone()
                assert row == ("old",)
            h.signal(sid(), "resume-snapshot", {})
            cap.wait_notification("COMPLETED", timeout=120, after=mark)
        finally:
            with psycopg.connect(h.dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_cancel_backend(%s)", (pid,))  # commits locally
            committing.join(30)
            stuck.close()
        with psycopg.connect(h.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT v FROM lv WHERE id = %s", (key,)).fetchone() == ("new",)
        cap.assert_oracle({"lv": ["id"]})


def _synchronous_standby_names(cluster: PgCluster, value: str | None) -> None:
    """``ALTER SYSTEM SET`` it (None: ``RESET``, back to the cluster's 'ghost'), reload,
    and wait until a new session sees it (the reload is asynchronous)."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        if value is None:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        else:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{value}'")
        conn.execute("SELECT pg_reload_conf()")
    want = "ghost" if value is None else value

    def seen() -> bool:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            row = conn.execute("SHOW synchronous_standby_names").fetchone()
            return row is not None and row[0] == want

    wait_for(seen, 30, f"synchronous_standby_names = {want!r}", 0.05)


def test_blocking_snapshot_during_a_commit_held_for_a_synchronous_standby(
    sync_cluster: PgCluster, sync_db: str, tmp_path: Path
) -> None:
    """A blocking snapshot is read while a commit that updates one row and deletes
    another is decoded and logged but waits for a synchronous standby that is not
    connected (invisible). The paused stream never delivers it again, so an unfenced
    blocking read that misses it lands the older rows after its events for good (the
    deleted row back). Fenced, the read cannot decide while the commit waits and is read
    again once ``synchronous_standby_names`` is cleared (which releases it). Fails when
    blocking reads are not fenced."""
    h = PgHarness(sync_db)
    h.execute(
        "CREATE TABLE lv (id int PRIMARY KEY, v text, n int)",
        "INSERT INTO lv SELECT g, 'old', g FROM generate_series(1, 2000) g",
    )
    updated, deleted = 1500, 700
    extra = "[snapshot]\nchunk_size = 500\nadaptive = false\n"
    with Capture(h, tmp_path, extra) as cap:
        cap.caught_up()
        mark = cap.end()
        stuck = psycopg.connect(h.dsn)
        stuck.execute("SET synchronous_commit = on")  # (this session waits for 'ghost')
        stuck.execute("UPDATE lv SET v = 'new', n = -n WHERE id = %s", (updated,))
        stuck.execute("DELETE FROM lv WHERE id = %s", (deleted,))
        committing = threading.Thread(target=stuck.commit)
        committing.start()
        released = False
        try:
            # The commit is decoded and logged while it waits for the standby...
            cap.wait_until(
                lambda ev: any(e["op"] == "d" and e["key"] == {"id": deleted} for e in ev),
                timeout=60, what="the held commit in the log")
            with psycopg.connect(h.dsn, autocommit=True) as conn:  # ...yet invisible
                row = conn.execute("SELECT v FROM lv WHERE id = %s", (updated,)).fetchone()
                assert row == ("old",)
            # (The signal commits locally: the stream pauses after the held commit.)
            h.signal(sid(), "execute-snapshot",
                     {"data-collections": ["public\\.lv"], "type": "blocking"})
            cap.read_again_or_completed(mark)
            assert committing.is_alive()  # the interleaving was forced: still held
            _synchronous_standby_names(sync_cluster, "")  # releases the commit
            released = True
            committing.join(30)
            cap.wait_notification("COMPLETED", timeout=60, after=mark)
        finally:
            try:
                if not released:
                    _synchronous_standby_names(sync_cluster, "")
                committing.join(30)
                stuck.close()
            finally:
                _synchronous_standby_names(sync_cluster, None)
        events = cap.assert_oracle({"lv": ["id"]})
    assert [e["after"]["v"] for e in events if e["key"] == {"id": updated}][-1] == "new"
