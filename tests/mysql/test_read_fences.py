"""Read-only chunks' GTID fences against real servers under concurrent commits.

Writers insert rows as fast as they can (one row a transaction) while the reader reads
the whole table with ``read_chunk_fenced`` again and again; the binlog stream tells
which GTID inserted which row. For every read: a row whose transaction the fence calls
visible is in the read; a row in the read has its transaction in the fence's ``high``
(so the stream passing ``high`` has delivered it); and the fence passes at the stream
position after its last transaction. Also: ``gtid_mode = OFF`` is refused with a
message naming the setting, by the reader and by the stream.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.errors import SourceError
from pydblog.events import ChangeEvent, Op
from pydblog.ports import Commit
from pydblog.sources.mysql.fences import UNFENCED, GtidFence
from pydblog.sources.mysql.position import BinlogPosition
from tests.mysql.helpers import make, opened
from tests.mysql.servers import require_mysql57

READS = 25


def _writer(server: TestServer, db: str, stop: threading.Event, done: list[int]) -> None:
    conn = server.connect(db)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                cur.execute("INSERT INTO t (w) VALUES (1)")
                done.append(1)
    finally:
        conn.close()


def _wait_rows(done: list[int], n: int) -> None:
    """Until the writers have committed ``n`` rows (a quiet machine read all the table
    before the first insert once: nothing was checked)."""
    deadline = time.monotonic() + 60
    while len(done) < n:
        assert time.monotonic() < deadline, f"the writers committed {len(done)} rows in 60 s"
        time.sleep(0.01)


def test_fences_match_what_each_read_saw(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, w INT)", db)
    src, stream = opened(server, db)
    _, reader = make(server, db)
    stop = threading.Event()
    done: list[int] = []
    writers = [threading.Thread(target=_writer, args=(server, db, stop, done)) for _ in range(4)]
    for th in writers:
        th.start()
    reads: list[tuple[set[int], GtidFence]] = []
    try:
        info = reader.table_info(f"{db}.t")
        assert info is not None
        _wait_rows(done, 20)  # the reads run while rows are being committed
        for _ in range(READS):
            rows, fence = reader.read_chunk_fenced(info, None, (2**31 - 1,), 10**9, None)
            assert isinstance(fence, GtidFence)
            reads.append(({int(r["id"]) for r in rows}, fence))
        _wait_rows(done, 101)
    finally:
        stop.set()
        for th in writers:
            th.join()
        reader.close()
    last = int(server.execute("SELECT MAX(id) FROM t", db)[0][0])
    inserts: dict[int, ChangeEvent] = {}
    commits: list[BinlogPosition] = []
    try:
        for item in stream:
            if isinstance(item, ChangeEvent) and item.op is Op.CREATE and item.table == "t":
                assert item.key is not None
                inserts[int(item.key["id"])] = item
            elif isinstance(item, Commit):
                assert isinstance(item.position, BinlogPosition)
                commits.append(item.position)
                if len(inserts) == last:
                    break
    finally:
        src.close()
    assert sorted(inserts) == list(range(1, last + 1))
    at = {c.gtid: i for i, c in enumerate(commits)}
    for seen, fence in reads:
        for key, event in inserts.items():
            visible = fence.visible(event)
            if visible is True:
                assert key in seen, f"{_gtid(event)} called visible, row {key} not read"
            if key in seen:
                assert visible is not False, f"row {key} read, {_gtid(event)} not in high"
        # The stream passes the fence at the commit after which every read row (and
        # everything else in high) has been delivered; never before a read row's commit.
        first = next(i for i, c in enumerate(commits) if fence.passed(c))
        newest = max((at[_gtid(inserts[k])] for k in seen), default=-1)
        assert first >= newest
    assert sum(len(s) for s, _ in reads) > 0 and last > 100


def _gtid(event: ChangeEvent) -> str | None:
    pos = event.position
    assert isinstance(pos, BinlogPosition)
    return pos.gtid


def test_gtid_mode_off_is_refused_naming_the_setting(tmp_path: Any) -> None:
    require_mysql57()
    with MySQL57(server_id=7, settings={"gtid_mode": "OFF", "enforce_gtid_consistency": "OFF"}) as s:
        s.execute("CREATE DATABASE d")
        s.execute("CREATE TABLE d.t (id INT PRIMARY KEY)")
        src, reader = make(s, "d")
        info = reader.table_info("d.t")
        assert info is not None
        with pytest.raises(SourceError) as err:
            reader.read_chunk_fenced(info, None, (10,), 10, None)
        assert "gtid_mode is OFF" in str(err.value) and "gtid_mode = ON" in str(err.value)
        # Blocking reads are then not fenced (they cannot be: no error, and no warning
        # without semi-sync; docs/snapshots.md "Fenced blocking reads").
        assert not reader.fences_blocking_reads()
        reader.close()
        src.read_only = True
        with pytest.raises(SourceError) as err:
            src.open(None)
        assert "gtid_mode is OFF" in str(err.value) and "watermark" in str(err.value)


def test_blocking_reads_fall_back_unfenced_when_gtid_mode_is_lowered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a server: gtid_mode ON at the capture's start (blocking reads
    fenced), then stepped down online. The blocking read is read unfenced, with a
    warning naming blocking snapshots, the cause and the fix, not failed with the
    read-only mode's error (the table REJECTED after max_attempts)."""
    require_mysql57()
    with MySQL57(server_id=8) as s:
        s.execute("CREATE DATABASE d")
        s.execute("CREATE TABLE d.t (id INT PRIMARY KEY)")
        s.execute("INSERT INTO d.t VALUES (1), (2)")
        _, reader = make(s, "d")
        try:
            info = reader.table_info("d.t")
            assert info is not None
            assert reader.fences_blocking_reads()
            _, fence = reader.read_chunk_fenced(info, None, (10,), 10, None)
            assert isinstance(fence, GtidFence)
            s.execute("SET GLOBAL gtid_mode = ON_PERMISSIVE")
            rows, fence = reader.read_chunk_fenced(info, None, (10,), 10, None)
            assert [r["id"] for r in rows] == [1, 2] and fence is UNFENCED
            assert "blocking snapshot reads are no longer fenced: gtid_mode is ON_PERMISSIVE" \
                in caplog.text
        finally:
            reader.close()
