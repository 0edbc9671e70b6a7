"""Read-only snapshots whose chunks are read on a replica (``[snapshot] read_dsn``) while
the stream comes from the primary, on MariaDB and MySQL 5.7. The replica applies every
transaction a second late (``MASTER_DELAY = 1``) and has GTIDs of its own (MariaDB: its
user setup in domain 2; MySQL: a transaction under its own server_uuid), and a writer
changes the table on the primary before and during the snapshot. The oracle: the change
log materializes to the primary's table; the capture user cannot write."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydblog.config import parse_config
from pydblog.devtools.mysql57 import TestServer
from pydblog.errors import SourceError, SourceUnavailable
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from pydblog.sources.mysql.connect import MySqlDsn
from pydblog.sources.mysql.fences import GtidFence
from pydblog.sources.mysql.gtid import MariaGtidPos, parse_gtid_state
from pydblog.sources.mysql.setup import OwnTables
from tests.chaos import at_progress, kill_and_restart, kill_seed, reporting, writing
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.test_parallel import LogProgress, big_table
from tests.contract.test_read_only import ReadOnlyUser, assert_wrote_nothing
from tests.contract.test_snapshots import q, writer
from tests.helpers import sid, start_run
from tests.mysql.harness import MariaHarness
from tests.mysql.helpers import make
from tests.mysql.test_failover import _pair, new_database


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[TestServer, TestServer]]:
    with _pair(request.param) as (primary, replica):
        yield primary, replica


def _delay(replica: TestServer, seconds: int) -> None:
    replica.execute("STOP SLAVE")
    replica.execute(f"CHANGE MASTER TO MASTER_DELAY = {seconds}")
    replica.execute("START SLAVE")


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("pair", "parallelism"),
    [("mariadb", 4), pytest.param("mysql57", 4, marks=SLOW),
     pytest.param("mariadb", 1, marks=SLOW), pytest.param("mysql57", 1, marks=SLOW)],
    indirect=["pair"],
)
def test_chunks_read_on_a_lagging_replica(
    pair: tuple[TestServer, TestServer], tmp_path: Path, parallelism: int
) -> None:
    """Without the wait for the replica to catch up with the source before each chunk
    (``sources.mysql.replica.catch_up``) this failed: a row read before the replica had
    applied an update the stream had already delivered landed after that update."""
    primary, replica = pair
    db = new_database(primary, replica)
    h = ReadOnlyUser(MariaHarness(primary, db))
    rows = 3000
    big_table(h, rows)
    replica.wait_caught_up(primary)
    _delay(replica, 1)  # (kept for the module's later tests: they wait for it)
    read_dsn = replica.dsn(db, user=h.user, password="ro")
    extra = (f'[snapshot]\nchunk_size = 256\nparallelism = {parallelism}\n'
             f'watermark = "read-only"\nread_dsn = "{read_dsn}"')
    with Capture(h, tmp_path, extra) as cap:
        with writing(lambda stop: writer(h, "t1", stop, 21, rows + rows // 10)):
            cap.wait_until(lambda ev: len(ev) > 200, 60, "stream events")  # writes logged first
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            cap.wait_notification("COMPLETED", timeout=240)
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    assert len(snapshot_rows(events, "t1")) > rows // 2
    if parallelism > 1:
        assert f"up to {parallelism} read at once" in err
    assert_wrote_nothing(h)


@pytest.mark.parametrize("pair", ["mariadb", "mysql57"], indirect=True)
def test_read_dsn_must_be_a_replica_of_the_source(pair: tuple[TestServer, TestServer]) -> None:
    """The source itself is refused at once; a server that never applies the source's
    transactions makes each read-only chunk fail (retriable) after the wait, saying so;
    the replica reads, with a fence that leaves out its own GTIDs, and waits for the
    source's state before a max key or a plain chunk too."""
    primary, replica = pair
    db = new_database(primary, replica)
    primary.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    primary.execute("INSERT INTO t VALUES (1), (2), (3)", db)
    replica.wait_caught_up(primary)

    def reader(read: TestServer, source: TestServer, wait_ms: int = 15_000) -> MySqlSnapshotReader:
        own = OwnTables((db, "dblog_signal"), (db, "dblog_watermark"),
                        ("public", "dblog_signal"), ("public", "dblog_watermark"))
        matcher = parse_config({"source": {"type": "mysql", "dsn": primary.dsn(db)}})
        return MySqlSnapshotReader(
            MySqlDsn.parse(read.dsn(db)), matcher=matcher.source.table_matcher(), own=own,
            source=MySqlDsn.parse(source.dsn(db)), statement_timeout_ms=wait_ms,
        )

    r = reader(primary, primary)
    with pytest.raises(SourceError, match="is the source itself"):
        r.table_info(f"{db}.t")  # (captured tables are listed on the source: not checked)
    r.close()
    # The primary as the "replica" of its replica: it never applies the replica's own GTIDs.
    r = reader(primary, replica, wait_ms=1000)
    _, plain = make(primary, db)
    try:
        info = plain.table_info(f"{db}.t")
        assert info is not None
        unapplied = "did not apply the source's transactions"
        with pytest.raises(SourceUnavailable, match=unapplied):
            r.read_chunk_fenced(info, None, (3,), 10, None)
        with pytest.raises(SourceUnavailable, match=unapplied):  # (definitions too)
            r.table_info(f"{db}.t")
    finally:
        r.close()
        plain.close()
    r = reader(replica, primary)
    try:
        info = r.table_info(f"{db}.t")
        assert info is not None
        rows, fence = r.read_chunk_fenced(info, None, (3,), 10, None)
        assert [row["id"] for row in rows] == [1, 2, 3]
        assert isinstance(fence, GtidFence)
        primary_state = str(primary.execute(
            "SELECT @@GLOBAL.gtid_binlog_pos" if isinstance(fence.low, MariaGtidPos)
            else "SELECT @@GLOBAL.gtid_executed")[0][0]).replace("\n", "")
        assert str(fence.low) == str(fence.high) == str(parse_gtid_state(primary_state))
        # A table's max key and a blocking snapshot's chunk are read once the lagging
        # replica has what the source has (the stream may already have delivered more).
        _delay(replica, 1)
        primary.execute("INSERT INTO t VALUES (99)", db)
        assert r.max_key(info, None) == (99,)
        primary.execute("INSERT INTO t VALUES (100)", db)
        assert [row["id"] for row in r.read_chunk(info, (3,), (100,), 10, None)] == [99, 100]
        # One wait per snapshot request (the driver's begin_request): a chunk's
        # definition and its fenced read (and a table start's definition and max key)
        # wait once; the next request waits again and sees what the source had then.
        for key in (101, 102):
            r.begin_request()
            primary.execute(f"INSERT INTO t VALUES ({key})", db)
            waits = r.replica_waits
            info = r.table_info(f"{db}.t")
            assert info is not None
            rows, _ = r.read_chunk_fenced(info, (100,), (key,), 10, None)
            assert [row["id"] for row in rows] == [101, 102][: key - 100]
            assert r.max_key_fenced(info, None)[0] == (key,)
            assert r.replica_waits == waits + 1
    finally:
        r.close()


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["mariadb", "mysql57"], indirect=True)
def test_replica_snapshot_resumes_after_kill9(
    pair: tuple[TestServer, TestServer], tmp_path: Path
) -> None:
    """kill -9 twice at random points of a snapshot read on the lagging replica with four
    chunks in flight, under writes on the primary: each restart resumes after the
    emitted prefix (its unsettled events summarised in the checkpoint, settled again by
    the replica's fences) and the log materializes to the primary's table."""
    primary, replica = pair
    db = new_database(primary, replica)
    h = ReadOnlyUser(MariaHarness(primary, db))
    rows = 12_000
    big_table(h, rows)
    replica.wait_caught_up(primary)
    _delay(replica, 1)
    read_dsn = replica.dsn(db, user=h.user, password="ro")
    extra = ('[snapshot]\nchunk_size = 256\nparallelism = 4\n'
             f'watermark = "read-only"\nread_dsn = "{read_dsn}"')
    # A new seed each run (the kills' record in a failure names it: DBLOG_KILL_SEED runs
    # the same points again).
    seed = kill_seed(random.randrange(10**6))
    mid: list[bool] = []  # per kill: before the snapshot completed
    with Capture(h, tmp_path, extra) as cap:
        with writing(lambda stop: writer(h, "t1", stop, 23, rows + rows // 10)):
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            progress = LogProgress(cap)

            def kill() -> None:
                mid.append(not progress.done())
                cap.kill()

            # At random points of the snapshot's progress, without delay.
            kills = kill_and_restart(
                kill, cap.start, 2, seed, delay=(0.0, 0.0),
                each_round=at_progress(progress.wait, 2, 0.1 * rows, 0.6 * rows),
                note=lambda: f"{progress.rows} events logged, mid-snapshot {mid[-1]}")
            with reporting(kills):
                cap.wait_notification("COMPLETED", timeout=300)
        with reporting(kills):
            events = cap.assert_oracle({"t1": ["id"]})
        cap.stop()
    with reporting(kills):
        assert sum(mid) >= 1
        done = [e for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED"]
        assert len(done) == 1
    assert_wrote_nothing(h)


@pytest.mark.parametrize(
    "pair", ["mariadb", pytest.param("mysql57", marks=SLOW)], indirect=True
)
def test_initial_snapshot_on_a_replica_behind_the_streams_start(
    pair: tuple[TestServer, TestServer], tmp_path: Path
) -> None:
    """mode "initial" with chunks read on a replica that has not applied the primary's
    latest transactions when `dblog run` starts (its SQL thread stopped): a table
    created, filled and changed only on the primary before the start, one that exists on
    both with rows the replica lacks, and writes during the snapshot. The stream starts
    at the primary's binlog end, so only the snapshot can carry those rows: which tables
    are captured, their definitions and their max keys must come from a replica that
    has caught up with the stream's start. The oracle: every table's log materializes to
    the primary's table."""
    primary, replica = pair
    db = new_database(primary, replica)
    h = ReadOnlyUser(MariaHarness(primary, db))  # (the user must exist on the replica)
    h.execute("CREATE TABLE t0 (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
              "INSERT INTO t0 VALUES (1, 'both', 1)")
    replica.wait_caught_up(primary)
    replica.execute("STOP SLAVE SQL_THREAD")
    try:
        h.execute("INSERT INTO t0 VALUES (2, 'primary only', 2)",
                  "UPDATE t0 SET v = 'changed', n = 3 WHERE id = 1")
        big_table(h, 2000)  # t1: only on the primary
        h.execute("UPDATE t1 SET v = 'late' WHERE id >= 1900", "DELETE FROM t1 WHERE id < 10")
        read_dsn = replica.dsn(db, user=h.user, password="ro")
        # (A wait for the replica longer than the statement timeout fails, and is retried.)
        extra = ('[snapshot]\nmode = "initial"\nchunk_size = 128\nstatement_timeout_ms = 1000\n'
                 f'watermark = "read-only"\nread_dsn = "{read_dsn}"')
        cap = Capture(h, tmp_path, extra)
        cap.proc = start_run(cap.config, wait=False)
        time.sleep(4)  # the capture starts (and lists its tables) on the lagging replica
    finally:
        replica.execute("START SLAVE SQL_THREAD")
    try:
        with writing(lambda stop: writer(h, "t1", stop, 31, 2200)):
            cap.wait_notification("COMPLETED", timeout=180)
        events = cap.assert_oracle({"t0": ["id"], "t1": ["id"]})
    finally:
        cap.stop()
    assert len(snapshot_rows(events, "t0")) == 2
    assert_wrote_nothing(h)


@pytest.mark.parametrize("pair", ["mariadb"], indirect=True)
def test_a_signal_while_the_replica_lags_does_not_stall_the_stream(
    pair: tuple[TestServer, TestServer], tmp_path: Path
) -> None:
    """A snapshot signal arriving while the read replica has stopped applying (its SQL
    thread stopped) must not stop the stream: the capture thread lists the captured
    tables on the source and never waits for the replica (only the snapshot's chunks
    do). It failed: the capture thread waited for the replica in captured_tables, timed
    out after statement_timeout_ms, restarted, replayed the signal and waited again, so
    a later row of another table never reached the log."""
    primary, replica = pair
    db = new_database(primary, replica)
    h = ReadOnlyUser(MariaHarness(primary, db))
    big_table(h, 50)
    h.execute("CREATE TABLE t2 (id INT PRIMARY KEY, v VARCHAR(40))")
    replica.wait_caught_up(primary)
    read_dsn = replica.dsn(db, user=h.user, password="ro")
    extra = ('[snapshot]\nchunk_size = 16\nstatement_timeout_ms = 2000\n'
             f'watermark = "read-only"\nread_dsn = "{read_dsn}"')
    with Capture(h, tmp_path, extra) as cap:
        cap.caught_up()
        replica.execute("STOP SLAVE SQL_THREAD")
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            h.execute("INSERT INTO t2 VALUES (1, 'after the signal')")
            cap.wait_until(lambda ev: any((e.get("after") or {}).get("v") == "after the signal"
                                          for e in ev), 25, "the t2 row after the signal")
        finally:
            replica.execute("START SLAVE SQL_THREAD")
        cap.wait_notification("COMPLETED", timeout=120)
        cap.assert_oracle({"t1": ["id"], "t2": ["id"]})
        cap.stop()
    assert_wrote_nothing(h)
