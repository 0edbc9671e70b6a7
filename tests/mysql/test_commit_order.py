"""Watermark chunks where commits can become visible out of binlog order.

MySQL with ``binlog_order_commits = OFF`` commits each session's transaction in the engine
on its own after its group's binlog write: a watermark L written to the binlog after a
transaction T can be visible (and the chunk read) before T is, and without a fence the
window (which only drops keys of events after L) would keep T's key's older row and place
it after T's event. The reader then fences watermark chunks with GTID sets
(``MySqlSnapshotReader.fences_watermark_windows``, docs/snapshots.md). The moment itself
cannot be forced here (no debug build, no semi-sync plugin in this MySQL 5.7); this checks
when the reader fences, and that fenced watermark snapshots are exact under writes.
(Commits in binlog order, also waiting for a semi-sync replica: test_semisync.py.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydblog.capture.driver import SnapshotDriver
from pydblog.devtools.mysql57 import MySQL57
from pydblog.errors import SourceError
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.test_parallel import big_table
from tests.contract.test_snapshots import q, writer
from tests.helpers import sid
from tests.mysql.harness import MariaHarness
from tests.mysql.helpers import config, make
from tests.mysql.servers import Server


@pytest.fixture
def unordered(mysql57: MySQL57) -> Iterator[MySQL57]:
    """The session's MySQL 5.7 with ``binlog_order_commits = OFF`` for one test."""
    mysql57.execute("SET GLOBAL binlog_order_commits = OFF")
    try:
        yield mysql57
    finally:
        mysql57.execute("SET GLOBAL binlog_order_commits = ON")


def _fences(server: Server, db: str) -> bool:
    """Whether the reader fences watermark windows, and the driver judges them so."""
    _, reader = make(server, db)
    try:
        fences = reader.fences_watermark_windows()
        driver = SnapshotDriver(config(server, db), reader, None)
        assert driver.core._fencing.fenced == fences
        return fences
    finally:
        reader.close()


def test_fenced_only_where_commits_can_be_out_of_binlog_order(
    server: Server, db: str, request: pytest.FixtureRequest
) -> None:
    assert not _fences(server, db)  # MariaDB; MySQL with binlog_order_commits = ON
    if isinstance(server, MySQL57):
        # A capture that started with it ON notices a SET GLOBAL ... OFF at its next
        # table start (on a fork too): the table is rejected (not retried), saying how
        # to get fenced chunks; a new start fences.
        server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
        server.execute("INSERT INTO t VALUES (1), (2)", db)
        _, reader = make(server, db)
        try:
            assert not reader.fences_watermark_windows()
            info = reader.table_info(f"{db}.t")
            assert info is not None and reader.max_key(info, None) == (2,)
            fork = reader.fork()
            request.getfixturevalue("unordered")
            for r in (reader, fork):
                with pytest.raises(SourceError, match="binlog_order_commits was turned OFF") as exc:
                    r.max_key(info, None)
                assert not exc.value.retriable
            assert _fences(server, db)
            server.execute("SET GLOBAL binlog_order_commits = ON")
            assert reader.max_key(info, None) == (2,)
        finally:
            reader.close()


@pytest.mark.parametrize("parallelism", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_fenced_watermark_snapshot_under_writes(
    unordered: MySQL57, my57_db: str, tmp_path: Path, parallelism: int
) -> None:
    h = MariaHarness(unordered, my57_db)
    rows = 3000
    big_table(h, rows)
    extra = f'[snapshot]\nchunk_size = 200\nparallelism = {parallelism}\nwatermark = "table"'
    with Capture(h, tmp_path, extra) as cap:
        stop = threading.Event()
        th = threading.Thread(target=writer, args=(h, "t1", stop, 7, rows + rows // 10))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            cap.wait_notification("COMPLETED", timeout=240)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    # It ran fenced (unfenced it would pass too whenever no commit became visible late).
    assert "watermark windows are read fenced" in err, err[-2000:]
    assert len(snapshot_rows(events, "t1")) > rows // 2


def test_blocking_reads_are_fenced(server: Server, db: str) -> None:
    """Blocking reads are fenced on MariaDB and on MySQL with GTIDs (the fixtures' 5.7
    has gtid_mode = ON), watermark windows not (``CoreSettings.fenced_blocking``): a
    commit can be streamed before it is visible (semi-sync AFTER_SYNC,
    test_semisync.py), and no L orders a blocking read after it."""
    _, reader = make(server, db)
    try:
        assert reader.fences_blocking_reads()
        core = SnapshotDriver(config(server, db), reader, None).core
        assert core._fencing.fenced_blocking and not core._fencing.fenced
    finally:
        reader.close()


@pytest.mark.slow
def test_fenced_blocking_snapshot_under_writes(server: Server, db: str, tmp_path: Path) -> None:
    """A fenced blocking snapshot of a table written to meanwhile ends, and the log
    materializes to the table (MariaDB's fence can be inconclusive while a commit is
    between its binlog write and its engine commit: those reads are read again)."""
    h = MariaHarness(server, db)
    rows = 3000
    big_table(h, rows)
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 200\n") as cap:
        cap.caught_up()
        mark = cap.end()
        stop = threading.Event()
        th = threading.Thread(target=writer, args=(h, "t1", stop, 11, rows + rows // 10))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot",
                     {"data-collections": [q(h, "t1")], "type": "blocking"})
            cap.wait_notification("COMPLETED", timeout=240, after=mark)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"t1": ["id"]})
    assert len(snapshot_rows(events, "t1")) > rows // 2
