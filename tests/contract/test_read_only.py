"""Read-only incremental snapshots (``watermark = "read-only"``) against real servers:
a primary, and a hot standby (``pg_basebackup -R``) that the chunks are read from while
the stream comes from the primary. Each scenario writes during the snapshot and ends
with the oracle (materialized change log == source, positions unique and ordered), and
checks that the snapshot wrote nothing to the source.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.pgstandby import PgStandby
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import Harness, PgHarness
from tests.contract.test_snapshots import make_table, q, sid, writer


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
    """Updates of the watermark table's row so far (it starts with value '')."""
    with psycopg.connect(h.dsn) as conn:  # type: ignore[attr-defined]
        row = conn.execute("SELECT count(*) FROM dblog_watermark WHERE value <> ''").fetchone()
    return int(row[0]) if row else 0


def snapshot_with_writes(h: PgHarness, cap: Capture, rows: int, seed: int) -> None:
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(h, "t1", stop, seed, rows + rows // 5))
    th.start()
    try:
        h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
        cap.wait_notification("COMPLETED", timeout=180)
    finally:
        stop.set()
        th.join()


def test_read_only_snapshot_on_the_primary(pg: PgHarness, tmp_path: Path) -> None:
    make_table(pg, "t1", 2000)
    extra = '[snapshot]\nchunk_size = 50\nwatermark = "read-only"'
    with Capture(pg, tmp_path, extra) as cap:
        snapshot_with_writes(pg, cap, 2000, seed=3)
        events = cap.assert_oracle({"t1": ["id"]})
    assert snapshot_rows(events, "t1")
    assert watermark_writes(pg) == 0


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


def test_read_only_snapshot_resumes_after_kill9(pg: PgHarness, tmp_path: Path) -> None:
    make_table(pg, "t1", 3000)
    extra = '[snapshot]\nchunk_size = 40\nwatermark = "read-only"'
    cap = Capture(pg, tmp_path, extra).start()
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(pg, "t1", stop, 5, 3500))
    th.start()
    try:
        pg.signal(sid(), "execute-snapshot", {"data-collections": [q(pg, "t1")]})
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
    assert watermark_writes(pg) == 0


def test_read_only_chunks_close_on_an_idle_stream(pg: PgHarness, tmp_path: Path) -> None:
    """No writes and no heartbeats: the rows land once a keepalive (asked for while a
    chunk waits) says the stream has passed the read's fence."""
    from pydblog.changelog.sqlite import SqliteChangeLogReader
    from tests.helpers import start_run, stop_run

    make_table(pg, "t1", 1000)
    config = tmp_path / "dblog.toml"
    config.write_text(
        f'[source]\ndsn = "{pg.dsn}"\nheartbeat_interval_s = 600\n'
        f'[log]\npath = "{tmp_path / "data"}"\n'
        '[snapshot]\nchunk_size = 100\nwatermark = "read-only"\n'
    )
    proc = start_run(config)
    try:
        t0 = time.monotonic()
        pg.signal(sid(), "execute-snapshot", {"data-collections": [q(pg, "t1")]})
        reader = SqliteChangeLogReader(tmp_path / "data")
        while time.monotonic() - t0 < 60:
            if any(b'"COMPLETED"' in r.body for r in reader.read(0, 10**6)):
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        reader.close()
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-2000:]
    assert elapsed < 30, f"10 chunks took {elapsed:.1f}s on an idle stream"
    assert watermark_writes(pg) == 0


def test_read_only_parallel_chunks_on_the_primary(pg: PgHarness, tmp_path: Path) -> None:
    """Read-only chunks of 8,192 rows split over four connections that share the
    chunk's exported snapshot, under a write load."""
    pg.execute(
        "CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
        "INSERT INTO t1 SELECT g, 'v' || g, g % 7 FROM generate_series(0, 29999) g",
    )
    extra = '[snapshot]\nchunk_size = 8192\nparallelism = 4\nwatermark = "read-only"'
    with Capture(pg, tmp_path, extra) as cap:
        snapshot_with_writes(pg, cap, 30_000, seed=9)
        events = cap.assert_oracle({"t1": ["id"]})
    assert len(snapshot_rows(events, "t1")) > 20_000
    assert watermark_writes(pg) == 0
