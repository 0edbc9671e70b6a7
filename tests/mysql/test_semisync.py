"""A commit the binlog stream delivers before it becomes visible, during a MariaDB snapshot.

With semi-synchronous replication and ``rpl_semi_sync_master_wait_point = AFTER_SYNC``
a commit is written to the binlog (and sent to every binlog reader, pydblog's stream
among them) before it waits for a replica's acknowledgement, and only becomes visible
to other sessions after it: the MySQL/MariaDB twin of PostgreSQL's late-visible commit
(tests/integration/test_late_visible_commit.py). Here the server has semi-sync on and no
replica: a commit waits until the test switches semi-sync off.

What it shows (docs/snapshots.md, "A commit the stream delivered before L"):
- ``watermark = "table"``: the chunk's low watermark L is itself a commit, written to
  the binlog after the stuck one (the test holds L back until then), and MariaDB makes
  commits visible in binlog order (a commit group's semi-sync wait holds the next
  group's): L cannot commit, so no chunk is read, until the stuck commit is visible. The
  snapshot stalls while the commit waits, then reads the new row. (MySQL: the same with ``binlog_order_commits = ON``, its
  default; with it off the reader fences watermark chunks, tests/mysql/test_mysql57.py.)
- ``watermark = "read-only"``: nothing waits; each chunk's GTID fence keeps the stuck
  event "not known visible" (``high`` holds its GTID; ``low`` is empty while a commit is
  between its binlog write and its engine commit), so its key is dropped from the chunk
  and the log keeps the event. The snapshot completes while the commit still waits.
  Asked for (through the API) after the stuck event was logged, the snapshot's floor is
  not covered by any fence until the commit is visible: its chunks are read again, and
  nothing of the table is logged meanwhile.
Either way the log materializes to the table.
- A blocking snapshot (``test_blocking_snapshot_during_...``): no L orders its reads after
  the stuck commit, so they are fenced (``CoreSettings.fenced_blocking``): read again
  until the commit is visible. Unfenced they logged the old rows after its events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pydblog.capture.signals import post_signal
from pydblog.config import load_config
from pydblog.devtools.mariadb import MariaDB
from tests.contract.capture import Capture
from tests.contract.test_read_only import ReadOnlyUser
from tests.helpers import sid
from tests.mysql.harness import MariaHarness
from tests.mysql.servers import _fresh_database, require_mariadb

ROWS = 5_000


@pytest.fixture(scope="module")
def semisync() -> Iterator[MariaDB]:
    """A MariaDB whose commits wait for a semi-sync replica that never comes while
    ``rpl_semi_sync_master_enabled`` is on (off but for the stuck writer's moment)."""
    require_mariadb()
    server = MariaDB(settings={
        "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
        "rpl_semi_sync_master_timeout": "3600000",
        "rpl_semi_sync_master_wait_no_slave": "ON",
    }).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def semi_db(semisync: MariaDB) -> Iterator[str]:
    yield from _fresh_database(semisync)


def _semisync(server: MariaDB, on: bool) -> None:
    server.execute(f"SET GLOBAL rpl_semi_sync_master_enabled = {int(on)}")


def _read_up_to(events: list[dict[str, object]]) -> int:
    return max((int(e["key"]["id"]) for e in events  # type: ignore[index]
                if e["op"] == "r" and e["source"]["table"] == "lv"), default=0)  # type: ignore[index]


@pytest.mark.parametrize(
    "case", ["table", "read-only", pytest.param("read-only-late", marks=pytest.mark.slow)]
)
def test_commit_streamed_before_it_is_visible(
    semisync: MariaDB, semi_db: str, tmp_path: Path, case: str
) -> None:
    """``read-only-late``: the snapshot is asked for (through the API) only once the
    stuck commit is in the log, so its event precedes the table's snapshot."""
    watermark = "table" if case == "table" else "read-only"
    late = case == "read-only-late"
    inner = MariaHarness(semisync, semi_db)
    h = ReadOnlyUser(inner) if watermark == "read-only" else inner
    h.execute(
        "CREATE TABLE lv (id INT PRIMARY KEY, v VARCHAR(20))",
        f"INSERT INTO lv SELECT seq, 'old' FROM seq_1_to_{ROWS}",
    )
    h.execute("CREATE TABLE warm (id INT PRIMARY KEY)", "INSERT INTO warm VALUES (1)")
    key = ROWS - 10
    extra = (f'[snapshot]\nchunk_size = 100\nadaptive = false\nwatermark = "{watermark}"\n'
             '[api]\nlisten = "127.0.0.1:0"\ntoken = "semisync-token-0123456789"\n')
    with Capture(h, tmp_path, extra) as cap:
        # A first snapshot: read-only fences then know no transaction delivered before
        # the capture started is still invisible (see test_late_visible_commit.py).
        h.signal(sid(), "execute-snapshot", {"data-collections": [f"{semi_db}\\.warm"]})
        cap.wait_notification("COMPLETED")
        mark = cap.end()  # (warm's STARTED and COMPLETED are in the log)
        lv = {"data-collections": [f"{semi_db}\\.lv"]}
        if late:
            pass  # asked for through the API once the stuck commit is in the log
        elif watermark == "read-only":  # resumed through the API (no commit)
            h.signal(sid(), "execute-snapshot", lv)
            h.signal(sid(), "pause-snapshot", {})
            cap.wait_notification("PAUSED")
        else:
            # The snapshot's first L waits for this lock (a rollback writes no binlog, so
            # it releases L while the stuck commit waits): L is then written after the
            # stuck commit is in the log.
            locker = semisync.connect(semi_db)
            locker.begin()
            locker.cursor().execute("SELECT * FROM dblog_watermark WHERE id = 1 FOR UPDATE")
            h.signal(sid(), "execute-snapshot", lv)
            cap.wait_notification("STARTED", after=mark)
        stuck = semisync.connect(semi_db)
        _semisync(semisync, True)
        committing = threading.Thread(
            target=lambda: stuck.cursor().execute("UPDATE lv SET v = 'new' WHERE id = %s", (key,))
        )
        committing.start()
        released = False
        try:
            # The commit is streamed and logged while it waits for the replica...
            events = cap.wait_until(
                lambda ev: any(e["op"] == "u" and e["key"] == {"id": key} for e in ev),
                timeout=60, what="the stuck update in the log")
            assert _read_up_to(events) < key
            with semisync.admin(semi_db) as cur:  # ...yet invisible
                cur.execute("SELECT v FROM lv WHERE id = %s", (key,))
                assert cur.fetchone() == ("old",)
            if watermark == "table":
                locker.rollback()
                # The chunk's L commits behind the stuck commit: no chunk is read.
                time.sleep(2)
                assert committing.is_alive() and _read_up_to(cap.events()) == 0
            elif late:
                post_signal(load_config(cap.config), sid(), "execute-snapshot", lv)
                # The event precedes the table's snapshot (judged by its floor): no
                # read's fence shows it visible, so every chunk is read again later.
                time.sleep(3)
                assert committing.is_alive() and _read_up_to(cap.events()) == 0
            else:
                post_signal(load_config(cap.config), sid(), "resume-snapshot", {})
                cap.wait_notification("COMPLETED", timeout=120, after=mark)
                assert committing.is_alive()  # read past the key while it was invisible
            _semisync(semisync, False)
            released = True
            cap.wait_notification("COMPLETED", timeout=120, after=mark)
        finally:
            if not released:
                _semisync(semisync, False)
            committing.join(30)
            stuck.close()
            if watermark == "table":
                locker.close()
        events = cap.assert_oracle({"lv": ["id"]})
    assert [e["after"]["v"] for e in events if e["key"] == {"id": key}][-1] == "new"



def test_blocking_snapshot_during_a_commit_streamed_before_it_is_visible(
    semisync: MariaDB, semi_db: str, tmp_path: Path
) -> None:
    """A blocking snapshot is read while a commit that updates one row and deletes
    another is in the binlog (streamed and logged) but not visible yet (semi-sync
    ``AFTER_SYNC`` waits for a replica that never comes). The paused stream never
    delivers that commit again, so an unfenced blocking read that misses it lands the
    older rows after its events for good: the updated row's old version, the deleted row
    back (docs/exactness.md; failed before blocking reads were fenced on MySQL/MariaDB).
    Fenced, the read cannot decide while the commit is held (its fence does not cover
    the table's floor) and is read again once the commit is visible."""
    h = MariaHarness(semisync, semi_db)
    h.execute(
        "CREATE TABLE lv (id INT PRIMARY KEY, v VARCHAR(20), n INT)",
        "INSERT INTO lv SELECT seq, 'old', seq FROM seq_1_to_2000",
    )
    updated, deleted = 1500, 700
    extra = "[snapshot]\nchunk_size = 500\nadaptive = false\n"
    with Capture(h, tmp_path, extra) as cap:
        cap.caught_up()  # streaming (the marker commits before semi-sync is on)
        mark = cap.end()
        stuck = semisync.connect(semi_db)
        _semisync(semisync, True)

        signal = sid()
        blocking = {"data-collections": [f"{semi_db}\\.lv"], "type": "blocking"}

        def commit() -> None:
            # The signal is part of the held transaction: the stream pauses for the
            # blocking snapshot at its end, after its update and delete, and no second
            # commit waits behind it (MariaDB's SHOW MASTER STATUS, a step of a fenced
            # read, would wait for that one: a leader holding the binlog lock).
            with stuck.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute("UPDATE lv SET v = 'new', n = -n WHERE id = %s", (updated,))
                cur.execute("DELETE FROM lv WHERE id = %s", (deleted,))
                cur.execute("INSERT INTO dblog_signal (id, type, data) VALUES (%s, %s, %s)",
                            (signal, "execute-snapshot", orjson.dumps(blocking).decode()))
                cur.execute("COMMIT")

        committing = threading.Thread(target=commit)
        committing.start()
        released = False
        try:
            # The commit is streamed and logged while it waits for the replica...
            cap.wait_until(
                lambda ev: any(e["op"] == "d" and e["key"] == {"id": deleted} for e in ev),
                timeout=60, what="the held commit in the log")
            with semisync.admin(semi_db) as cur:  # ...yet invisible
                cur.execute("SELECT v FROM lv WHERE id = %s", (updated,))
                assert cur.fetchone() == ("old",)
            # Unfenced, the blocking snapshot completes with rows read while the commit
            # is held; fenced, its reads cannot decide and are read again.
            cap.read_again_or_completed(mark)
            assert committing.is_alive()  # the interleaving was forced: still held
            _semisync(semisync, False)
            released = True
            cap.wait_notification("COMPLETED", timeout=60, after=mark)
        finally:
            if not released:
                _semisync(semisync, False)
            committing.join(30)
            stuck.close()
        events = cap.assert_oracle({"lv": ["id"]})
    assert [e["after"]["v"] for e in events if e["key"] == {"id": updated}][-1] == "new"
