"""The PostgreSQL read fences against a real primary and a real hot standby."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pydblog.config import parse_config
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.pgstandby import PgStandby
from pydblog.events import ChangeEvent, Op
from pydblog.positions import Lsn, PgPosition
from pydblog.sources.postgres.chunks import PgSnapshotReader
from pydblog.sources.postgres.fences import (
    PgLsnFence,
    PgXidFence,
    record_end,
    running_sql,
    snapshot_sql,
)
from pydblog.sources.postgres.source import PgLogSource


@pytest.fixture(scope="module")
def standby(pg_cluster: PgCluster) -> Iterator[PgStandby]:
    s = PgStandby(pg_cluster).start()
    try:
        yield s
    finally:
        s.stop()


def reader(dsn: str, read_dsn: str | None = None) -> PgSnapshotReader:
    snapshot = {"watermark": "read-only"} | ({"read_dsn": read_dsn} if read_dsn else {})
    cfg = parse_config({"source": {"dsn": dsn}, "snapshot": snapshot})
    return PgSnapshotReader(cfg, PgLogSource(cfg))


def event(tx: int, commit_lsn: int = 0) -> ChangeEvent:
    return ChangeEvent(Op.UPDATE, "public", "t", PgPosition(Lsn(commit_lsn), 0, None, tx), 0,
                       key={"id": 1}, after={"id": 1})


def test_primary_fence_sees_committed_transactions_not_running_ones(pg_db: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        done = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert done is not None
    running = psycopg.connect(pg_db)
    try:
        running.execute("UPDATE t SET v = 'x' WHERE id = 1")
        row = running.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        assert row is not None
        r = reader(pg_db)
        info = r.table_info("public.t")
        assert info is not None
        rows, fence = r.read_chunk_fenced(info, None, (2,), 10, None)
        assert isinstance(fence, PgXidFence)
        assert len(rows) == 2
        assert fence.visible(event(done[0] & 0xFFFFFFFF)) is True
        assert fence.visible(event(row[0] & 0xFFFFFFFF)) is False  # running during the read
        assert fence.visible(event(fence.xmax + 5)) is False  # started after the read
        with psycopg.connect(pg_db, autocommit=True) as conn:
            lsn = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert lsn is not None and Lsn.parse(lsn[0]).value >= fence.end_lsn
        r.close()
    finally:
        running.close()


def test_standby_fence_by_replay_positions(pg_cluster: PgCluster, pg_db: str,
                                           standby: PgStandby) -> None:
    """A standby's snapshot lists no running transactions in ``xip`` (it keeps them
    elsewhere), which is why its fence is by WAL positions."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
    running = psycopg.connect(pg_db)
    try:
        running.execute("INSERT INTO t VALUES (5, 'x')")
        standby.wait_caught_up()
        dbname = pg_db.rsplit("/", 1)[1]
        with psycopg.connect(standby.dsn(dbname)) as conn:
            snap = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert snap is not None and snap[0].endswith(":")  # no xip on a standby
        r = reader(pg_db, standby.dsn(dbname))
        info = r.table_info("public.t")
        assert info is not None
        rows, fence = r.read_chunk_fenced(info, None, (9,), 10, None)
        assert isinstance(fence, PgLsnFence)
        assert len(rows) == 1
        assert fence.low_lsn <= fence.end_lsn
        assert fence.visible(event(1, fence.low_lsn - 1)) is True
        assert fence.visible(event(1, fence.low_lsn)) is None  # cannot tell: dropped
        r.close()
    finally:
        running.close()


@pytest.mark.parametrize(
    ("insert", "end"),
    [(0x1000, 0x1000), (0x2000 + 24, 0x2000), (0x1000000 + 40, 0x1000000), (0x2000 + 25, 0x2019)],
)
def test_insert_position_at_a_page_start_is_the_last_record_end(insert: int, end: int) -> None:
    assert record_end(insert) == end


def test_parallel_sub_reads_of_a_read_only_chunk_share_its_snapshot(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only chunk split over four connections reads every sub-range with the
    chunk's own (exported) snapshot: a commit made after the fence was taken, while the
    sub-reads start, is seen by none of them."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'old' FROM generate_series(1, 20000) g")
    cfg = parse_config({"source": {"dsn": pg_db},
                        "snapshot": {"watermark": "read-only", "parallelism": 4}})
    r = PgSnapshotReader(cfg, PgLogSource(cfg))
    info = r.table_info("public.t")
    assert info is not None
    run = r.subreads.run
    ran: list[int] = []

    def commit_first(tasks: list[Any]) -> list[Any]:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("UPDATE t SET v = 'new'")
        ran.append(len(tasks))
        return run(tasks)

    monkeypatch.setattr(r.subreads, "run", commit_first)
    rows, fence = r.read_chunk_fenced(info, None, (20000,), 12000, None)
    assert ran == [4] and isinstance(fence, PgXidFence)
    assert len(rows) == 12000
    assert all(row.after_json.endswith('"v":"old"}') for row in rows)
    r.close()


def test_first_read_only_chunk_of_a_fresh_reader_can_split(pg_db: str) -> None:
    """The sub-read pool is set up (it asks the server for its free connections)
    before the chunk's transaction: set up inside it, its commit failed the read."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10000) g")
    cfg = parse_config({"source": {"dsn": pg_db}, "snapshot": {"watermark": "read-only"}})
    r = PgSnapshotReader(cfg, PgLogSource(cfg))  # default parallelism: asks the server
    info = r.table_info("public.t")
    assert info is not None
    rows, fence = r.read_chunk_fenced(info, None, (10000,), 8192, None)
    assert r.subreads.parallelism >= 2
    assert len(rows) == 8192 and isinstance(fence, PgXidFence)
    r.close()


def test_postgresql_12_fences_by_the_txid_snapshot_functions(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL 12 has no ``pg_current_snapshot()``: its fences take
    ``txid_current_snapshot()`` (the same text, 64-bit xids), which PostgreSQL 15 still
    has, so the PostgreSQL 12 path runs here against this server: a fenced read sees the
    committed transaction and not the running one, and the running-xid query finds it.
    (Before, fenced watermark windows were off below 13, and read-only reads failed with
    'function pg_current_snapshot() does not exist'.)"""
    assert snapshot_sql(120000)[0] == "txid_current_snapshot()"
    assert snapshot_sql(130000)[0] == "pg_current_snapshot()"
    monkeypatch.setattr(PgSnapshotReader, "server_version", property(lambda self: 120000))
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        done = conn.execute("SELECT txid_current()").fetchone()
    assert done is not None
    running = psycopg.connect(pg_db)
    try:
        running.execute("UPDATE t SET v = 'x' WHERE id = 1")
        row = running.execute("SELECT txid_current()").fetchone()
        assert row is not None
        r = reader(pg_db)
        assert r.fences_watermark_windows()
        info = r.table_info("public.t")
        assert info is not None
        rows, fence = r.read_chunk_fenced(info, None, (2,), 10, None)
        assert isinstance(fence, PgXidFence) and len(rows) == 2
        assert fence.visible(event(done[0] & 0xFFFFFFFF)) is True
        assert fence.visible(event(row[0] & 0xFFFFFFFF)) is False
        # (asked by the running session itself: 'active' while it asks, not idle)
        held = {int(x) for x, _ in running.execute(running_sql(120000)).fetchall()}
        assert row[0] in held
        r.close()
    finally:
        running.close()
