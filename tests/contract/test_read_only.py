"""Read-only incremental snapshots (``watermark = "read-only"``) against real servers:
PostgreSQL (a primary, and a hot standby (``pg_basebackup -R``) that the chunks are read
from while the stream comes from the primary), MariaDB and MySQL 5.7 (GTID fences).
Each scenario writes during the snapshot and ends with the oracle (materialized change
log == source, positions unique and ordered), and checks that the snapshot wrote
nothing to the source: on MySQL/MariaDB the capture runs as a user with no write grant
at all, and on an idle server the binlog gains only the test's own signal.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pydblog.capture.status import read_status
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.pgstandby import PgStandby
from pydblog.sources.mysql.setup import OwnTables, signal_table_ddl
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import Harness, KafkaLogHarness, PgHarness, Wrapped, without_kafka
from tests.contract.test_parallel import big_table as parallel_table
from tests.contract.test_parallel import sized
from tests.contract.test_snapshots import make_table, q, writer
from tests.helpers import sid
from tests.mysql.harness import MariaHarness


class ReadOnlyUser(Wrapped):
    """A MySQL/MariaDB harness whose capture connects as a user that can only read
    (SELECT on the database, REPLICATION SLAVE and CLIENT): the server itself refuses
    any write of the capture. The signal table is created beforehand, as an
    administrator would."""

    def __init__(self, inner: MariaHarness) -> None:
        super().__init__(inner)
        self.inner: MariaHarness = inner
        server = inner.server
        self.user = f"ro_{uuid.uuid4().hex[:8]}"
        own = OwnTables((self.schema, "dblog_signal"), (self.schema, "dblog_watermark"),
                        ("public", "dblog_signal"), ("public", "dblog_watermark"))
        server.execute(signal_table_ddl(own))
        server.execute(f"CREATE USER '{self.user}'@'127.0.0.1' IDENTIFIED BY 'ro'")
        server.execute(f"GRANT SELECT ON `{self.schema}`.* TO '{self.user}'@'127.0.0.1'")
        server.execute(
            f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{self.user}'@'127.0.0.1'"
        )

    def config(self, directory: Path, extra: str = "") -> Path:
        path = self.inner.config(directory, extra)
        server = self.inner.server
        path.write_text(path.read_text().replace(
            server.dsn(self.schema), server.dsn(self.schema, user=self.user, password="ro")))
        return path


def read_only(h: Harness) -> Harness:
    """``h``; MySQL/MariaDB's with a capture user that cannot write (in front of the
    same Kafka log, if ``h`` writes one)."""
    if isinstance(h, KafkaLogHarness):
        return h.around(read_only(h.inner))
    return ReadOnlyUser(h) if isinstance(h, MariaHarness) else h


@pytest.fixture
def ro(harness: Harness) -> Harness:
    """The contract harness; MySQL/MariaDB's with a capture user that cannot write."""
    return read_only(harness)


@pytest.fixture(scope="module")
def pg_standby(pg_cluster: PgCluster) -> Iterator[PgStandby]:
    standby = PgStandby(pg_cluster, apply_delay_ms=150).start()  # a lagging standby
    try:
        yield standby
    finally:
        standby.stop()


@pytest.fixture
def pg(pg_db: str) -> PgHarness:
    return PgHarness(pg_db)


def watermark_writes(h: Harness) -> int:
    """Updates of the watermark table's row so far (it starts with value ''); 0 when
    there is no watermark table (read-only captures create none)."""
    h = without_kafka(h)
    with psycopg.connect(h.dsn) as conn:  # type: ignore[attr-defined]
        if conn.execute("SELECT to_regclass('dblog_watermark')").fetchone() == (None,):
            return 0
        row = conn.execute("SELECT count(*) FROM dblog_watermark WHERE value <> ''").fetchone()
    return int(row[0]) if row else 0


def assert_wrote_nothing(h: Harness) -> None:
    """No watermark table was even created (MySQL/MariaDB: the capture user cannot
    write at all; PostgreSQL: read-only captures create no table)."""
    h = without_kafka(h)
    if isinstance(h, ReadOnlyUser):
        server = h.inner.server
        found = server.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
            f"'{h.schema}' AND TABLE_NAME = 'dblog_watermark'")
        assert not found, "a watermark table was created"
    else:
        with psycopg.connect(h.dsn) as conn:  # type: ignore[attr-defined]
            regclass = conn.execute("SELECT to_regclass('dblog_watermark')").fetchone()
        assert regclass == (None,), "a watermark table was created"


def snapshot_with_writes(h: Harness, cap: Capture, rows: int, seed: int) -> None:
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(h, "t1", stop, seed, rows + rows // 5))
    th.start()
    try:
        h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
        cap.wait_notification("COMPLETED", timeout=180)
    finally:
        stop.set()
        th.join()


@pytest.mark.mysql57
def test_read_only_snapshot_on_the_primary(ro: Harness, tmp_path: Path) -> None:
    make_table(ro, "t1", 2000)
    extra = '[snapshot]\nchunk_size = 50\nwatermark = "read-only"'
    with Capture(ro, tmp_path, extra) as cap:
        snapshot_with_writes(ro, cap, 2000, seed=3)
        events = cap.assert_oracle({"t1": ["id"]})
    assert snapshot_rows(events, "t1")
    assert_wrote_nothing(ro)


def test_read_only_snapshot_from_a_hot_standby(
    pg: PgHarness, pg_standby: PgStandby, tmp_path: Path
) -> None:
    """Chunks read on the standby (which lags the primary), the stream from the primary."""
    make_table(pg, "t1", 2000)
    dbname = pg.dsn.rsplit("/", 1)[1]
    pg_standby.wait_caught_up()
    extra = (
        f'[snapshot]\nchunk_size = 50\nwatermark = "read-only"\n'
        f'read_dsn = "{pg_standby.dsn(dbname)}"'
    )
    with Capture(pg, tmp_path, extra) as cap:
        snapshot_with_writes(pg, cap, 2000, seed=4)
        events = cap.assert_oracle({"t1": ["id"]})
    assert snapshot_rows(events, "t1")
    assert watermark_writes(pg) == 0


def test_read_only_snapshot_from_a_standby_that_has_not_replayed_the_stream(
    pg: PgHarness, pg_standby: PgStandby, tmp_path: Path
) -> None:
    """Deterministic: the stream delivers an update *before* the snapshot starts, while
    the standby (replay paused) has not replayed it yet. A chunk read there sees the old
    row; the update was logged before the table was even watched, so no window holds it,
    and the chunk's fence must not be trusted until the standby has replayed everything
    the stream had delivered when the table's snapshot began: the chunk is read again
    once replay resumes, and the log ends with the new row."""
    make_table(pg, "t1", 300)
    dbname = pg.dsn.rsplit("/", 1)[1]
    pg_standby.wait_caught_up()
    extra = (
        f'[snapshot]\nchunk_size = 50\nwatermark = "read-only"\n'
        f'read_dsn = "{pg_standby.dsn(dbname)}"'
    )
    with Capture(pg, tmp_path, extra) as cap, psycopg.connect(
        pg_standby.dsn(), autocommit=True
    ) as standby:
        cap.caught_up()
        standby.execute("SELECT pg_wal_replay_pause()")
        try:
            pg.execute("UPDATE t1 SET n = 100, v = 'new' WHERE id IN (7, 123, 299)")
            cap.wait_until(lambda ev: sum(1 for e in ev if e["op"] == "u") == 3,
                           what="the updates in the log")
            pg.signal(sid(), "execute-snapshot", {"data-collections": [q(pg, "t1")]})
            time.sleep(2)  # chunks read on the paused standby (and, wrongly, emitted)
        finally:
            standby.execute("SELECT pg_wal_replay_resume()")
        cap.wait_notification("COMPLETED", timeout=60)
        events = cap.assert_oracle({"t1": ["id"]})
        # The reads waited for replay instead of being read and thrown away.
        assert reads_repeated(cap) == 0
    assert len(snapshot_rows(events, "t1")) == 300
    assert watermark_writes(pg) == 0


def reads_repeated(cap: Capture) -> int:
    """The capture's count of reads whose window was inconclusive (read again), from a
    status written after this call."""
    since = time.time()
    deadline = since + 30
    while time.time() < deadline:
        status = read_status(cap.log_dir)
        if status is not None and status["updated_at"] > since and status["snapshot"]:
            return int(status["snapshot"]["reads_repeated"])
        time.sleep(0.2)
    raise AssertionError("no status written")


def test_initial_read_only_snapshot_from_a_standby_behind_the_slots_start(
    pg: PgHarness, pg_standby: PgStandby, tmp_path: Path
) -> None:
    """Deterministic: mode "initial" reads the table on a standby (replay paused) that
    has not replayed rows committed before the capture's slot was created. The stream
    will never carry them; the snapshot must, so its upper bound (the max key) must not
    be read there before the standby has replayed up to the stream's start: the
    table's start is read again once replay resumes, and every row is logged."""
    make_table(pg, "t1", 200)
    dbname = pg.dsn.rsplit("/", 1)[1]
    pg_standby.wait_caught_up()
    extra = (
        f'[snapshot]\nmode = "initial"\nchunk_size = 50\nwatermark = "read-only"\n'
        f'read_dsn = "{pg_standby.dsn(dbname)}"'
    )
    with psycopg.connect(pg_standby.dsn(), autocommit=True) as standby:
        standby.execute("SELECT pg_wal_replay_pause()")
        try:
            pg.execute("INSERT INTO t1 (id, v, n) SELECT i, 'late', 1 FROM generate_series(200, 299) i")
            cap = Capture(pg, tmp_path, extra).start()
            time.sleep(2)  # the table started on the paused standby (and, wrongly, kept)
        finally:
            standby.execute("SELECT pg_wal_replay_resume()")
    try:
        cap.wait_notification("COMPLETED", timeout=60)
        events = cap.assert_oracle({"t1": ["id"]})
    finally:
        cap.stop()
    assert len(snapshot_rows(events, "t1")) == 300
    assert watermark_writes(pg) == 0


@pytest.mark.mysql57
def test_read_only_snapshot_resumes_after_kill9(ro: Harness, tmp_path: Path) -> None:
    make_table(ro, "t1", 3000)
    extra = '[snapshot]\nchunk_size = 40\nwatermark = "read-only"'
    cap = Capture(ro, tmp_path, extra).start()
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(ro, "t1", stop, 5, 3500))
    th.start()
    try:
        ro.signal(sid(), "execute-snapshot", {"data-collections": [q(ro, "t1")]})
        cap.wait_notification("IN_PROGRESS", count=10)
        cap.kill()
        cap.start()
        cap.wait_notification("COMPLETED", timeout=180)
    finally:
        stop.set()
        th.join()
    events = cap.assert_oracle({"t1": ["id"]})
    cap.stop()
    completed = [e for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED"]
    assert len(completed) == 1
    assert_wrote_nothing(ro)


def _transactions_logged(h: Harness) -> int | None:
    """MySQL/MariaDB: how many transactions the server's binlog holds so far (GTIDs)."""
    h = without_kafka(h)
    if not isinstance(h, ReadOnlyUser):
        return None
    server = h.inner.server
    from pydblog.devtools.mariadb import MariaDB
    from pydblog.sources.mysql.gtid import MariaGtidPos, MySqlGtidSet

    if isinstance(server, MariaDB):
        pos = MariaGtidPos.parse(str(server.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]))
        return sum(n for _, _, n in pos.domains)
    executed = MySqlGtidSet.parse(str(server.execute("SELECT @@GLOBAL.gtid_executed")[0][0]))
    return sum(b - a + 1 for _, iv in executed.sources for a, b in iv)


@pytest.mark.mysql57
def test_read_only_chunks_close_on_an_idle_stream(ro: Harness, tmp_path: Path) -> None:
    """No writes and no heartbeats: the rows land once the stream reports (asked for
    while a chunk waits) that it has passed the read's fence. MySQL/MariaDB: from the
    capture's start to the snapshot's end the binlog gains exactly one transaction,
    the test's signal."""
    from pydblog.changelog import open_reader
    from pydblog.config import load_config
    from tests.helpers import start_run, stop_run

    make_table(ro, "t1", 1000)
    config = ro.config(tmp_path, '[snapshot]\nchunk_size = 100\nwatermark = "read-only"\n')
    config.write_text(config.read_text().replace(
        "heartbeat_interval_s = 0.5", "heartbeat_interval_s = 600"))
    before = _transactions_logged(ro)
    proc = start_run(config)
    try:
        t0 = time.monotonic()
        ro.signal(sid(), "execute-snapshot", {"data-collections": [q(ro, "t1")]})
        reader = open_reader(load_config(config).log)
        while time.monotonic() - t0 < 60:
            if any(b'"COMPLETED"' in r.body for r in reader.read(0, 10**6)):
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        rows = sum(1 for r in reader.read(0, 10**6) if b'"op":"r"' in r.body)
        reader.close()
        after = _transactions_logged(ro)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-2000:]
    assert elapsed < 30, f"10 chunks took {elapsed:.1f}s on an idle stream"
    assert rows == 1000
    assert_wrote_nothing(ro)
    if before is not None:
        assert after == before + 1, f"the binlog gained {after - before} transactions"  # type: ignore[operator]


def big_table(pg: PgHarness) -> None:
    pg.execute(
        "CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
        "INSERT INTO t1 SELECT g, 'v' || g, g % 7 FROM generate_series(0, 29999) g",
    )


@pytest.mark.mysql57
def test_read_only_parallel_chunks_on_the_primary(ro: Harness, tmp_path: Path) -> None:
    """Up to four read-only chunks at once (PostgreSQL: 8,192 rows each; MySQL/MariaDB:
    a quarter of that, on a capture user that cannot write), each with its own fence,
    under a write load."""
    rows, chunk = sized(ro, 30_000, 8192)
    parallel_table(ro, rows)
    extra = f'[snapshot]\nchunk_size = {chunk}\nparallelism = 4\nwatermark = "read-only"'
    with Capture(ro, tmp_path, extra) as cap:
        snapshot_with_writes(ro, cap, rows, seed=9)
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    assert len(snapshot_rows(events, "t1")) > rows * 2 // 3
    assert "up to 4 read at once" in err
    assert_wrote_nothing(ro)


def test_read_only_parallel_chunks_from_a_hot_standby(
    pg: PgHarness, pg_standby: PgStandby, tmp_path: Path
) -> None:
    """Concurrent read-only chunks read on a lagging standby (which cannot export a
    snapshot, so a chunk is never split there: the chunks run side by side instead)."""
    big_table(pg)
    dbname = pg.dsn.rsplit("/", 1)[1]
    pg_standby.wait_caught_up()
    extra = (
        '[snapshot]\nchunk_size = 4096\nparallelism = 4\nwatermark = "read-only"\n'
        f'read_dsn = "{pg_standby.dsn(dbname)}"'
    )
    with Capture(pg, tmp_path, extra) as cap:
        snapshot_with_writes(pg, cap, 30_000, seed=10)
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    assert len(snapshot_rows(events, "t1")) > 20_000
    assert "up to 4 read at once" in err
    assert watermark_writes(pg) == 0


def test_read_only_toast_rereads_from_a_hot_standby(
    pg: PgHarness, pg_standby: PgStandby, tmp_path: Path
) -> None:
    """Partial UPDATEs (the TOASTed column untouched) and key changes during a read-only
    snapshot whose chunks and key re-reads are read on the lagging standby: every
    dropped row and every key change's create is re-read there, fenced by the standby's
    replay position, and the log materializes to the table, TOASTed values included."""
    from tests.integration.test_toast import big_table, partial_updates, toasted

    big_table(pg, "pw", 200)
    assert toasted(pg, "pw") == 200
    dbname = pg.dsn.rsplit("/", 1)[1]
    pg_standby.wait_caught_up()
    extra = (
        f'[snapshot]\nchunk_size = 5\nadaptive = false\nwatermark = "read-only"\n'
        f'read_dsn = "{pg_standby.dsn(dbname)}"'
    )
    with Capture(pg, tmp_path, extra) as cap:
        stop = threading.Event()
        th = threading.Thread(target=partial_updates, args=(pg, "pw", stop, 200))
        th.start()
        try:
            pg.signal(sid(), "execute-snapshot", {"data-collections": [q(pg, "pw")]})
            cap.wait_notification("IN_PROGRESS", count=5)
            pg.execute("UPDATE pw SET id = id + 1000 WHERE id % 50 = 0")  # key changes
            cap.wait_notification("COMPLETED", timeout=180)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"pw": ["id"]})
    assert any(e["op"] == "c" and e.get("unchanged") == ["big"] for e in events)
    assert watermark_writes(pg) == 0
