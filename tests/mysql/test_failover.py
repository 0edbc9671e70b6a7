"""GTID resume across a failover: a primary and a GTID replica (log_slave_updates), whose
binlog files have other names, other sequence numbers and other offsets. Capture from the
primary, then resume from the replica with the same checkpoint: exactly the rest, once."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.errors import SourceError
from pydblog.events import ChangeEvent
from pydblog.ports import Checkpoint, Commit, Heartbeat
from tests.chaos import Load, kill_and_restart, kill_seed, reporting, writing
from tests.helpers import kill9, start_run, stop_run, wait_for
from tests.mysql.helpers import bpos, changes, commits, make, opened, read_until, run_sql
from tests.mysql.servers import require_mariadb, require_mysql57
from tests.mysql.test_oracle import (
    KEYS,
    TABLES,
    catch_up,
    materialize,
    setup_tables,
    write_config,
    writer,
)


@contextlib.contextmanager
def _pair(flavour: str) -> Iterator[tuple[TestServer, TestServer]]:
    """``(primary, replica)``, both MariaDB or both MySQL 5.7. The primary has rotated its
    binlog a few times (``primary-bin.000004``); the replica's files are
    ``replica-log.000001``…, and it has GTIDs of its own, so its GTID state has two
    parts: MariaDB: its user setup at start in GTID domain 2; MySQL: a transaction under
    its own server_uuid, at the start of its binlog."""
    primary: TestServer
    replica: TestServer | None = None
    if flavour == "mariadb":
        require_mariadb()
        primary = MariaDB(server_id=11, binlog_name="primary-bin").start()
    else:
        require_mysql57()
        primary = MySQL57(server_id=11, binlog_name="primary-bin").start()
    try:
        for _ in range(3):
            primary.execute("FLUSH BINARY LOGS")
        if isinstance(primary, MariaDB):
            replica = MariaDB(
                server_id=12, binlog_name="replica-log", settings={"gtid_domain_id": "2"}
            ).start()
        else:
            replica = MySQL57(server_id=12, binlog_name="replica-log").start()
            replica.execute("CREATE DATABASE replica_own")
        replica.replicate_from(primary)
        yield primary, replica
    finally:
        primary.stop()
        if replica is not None:
            replica.stop()


@pytest.fixture(scope="module", params=["mariadb", "mysql57"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[TestServer, TestServer]]:
    """One pair per flavour for the tests that leave it as they found it (each works in
    a fresh database)."""
    with _pair(request.param) as servers:
        yield servers


@pytest.fixture
def fresh_pair(request: pytest.FixtureRequest) -> Iterator[tuple[TestServer, TestServer]]:
    """A pair of its own (the test stops the primary and promotes the replica)."""
    with _pair(request.param) as servers:
        yield servers


def new_database(primary: TestServer, replica: TestServer) -> str:
    name = f"f_{uuid.uuid4().hex[:10]}"
    primary.execute(f"CREATE DATABASE `{name}`")
    replica.wait_caught_up(primary)
    return name


def binlog_files(server: TestServer) -> set[str]:
    return {str(r[0]) for r in server.execute("SHOW BINARY LOGS")}


def test_source_resumes_on_replica_by_gtid(pair: tuple[TestServer, TestServer]) -> None:
    primary, replica = pair
    db = new_database(primary, replica)
    primary.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(primary, db)
    try:
        run_sql(primary, db, "INSERT INTO t VALUES (1), (2), (3), (4), (5)")
        run_sql(primary, db, "INSERT INTO t VALUES (6), (7), (8)")
        first = read_until(stream, commits(2))
    finally:
        src.close()
    replica.wait_caught_up(primary)
    evs = changes(first)
    assert [e.after for e in evs] == [{"id": i} for i in range(1, 9)]
    commit1 = next(i for i in first if isinstance(i, Commit)).position
    # File + offset would be wrong on the replica: its files have other names.
    assert bpos(evs[0].position).file.startswith("primary-bin.00000")
    assert not binlog_files(replica) & {bpos(e.position).file for e in evs}
    # Checkpoints inside the first transaction, at its commit, inside the second.
    cases = [(evs[2].position, [4, 5, 6, 7, 8]), (commit1, [6, 7, 8]), (evs[6].position, [8])]
    for n, (cut, expected) in enumerate(cases):
        marker = 100 + n
        src, stream = opened(replica, db, Checkpoint(cut))
        try:
            run_sql(primary, db, f"INSERT INTO t VALUES ({marker})")  # replicated to it
            want = {"id": marker}
            got = read_until(stream, lambda items: any(e.after == want for e in changes(items)))  # noqa: B023
        finally:
            src.close()
        ids = [e.after["id"] for e in changes(got) if e.after]
        assert ids == [*expected, *range(100, marker + 1)], (cut, ids)  # earlier markers too
        positions = [bpos(i.position) for i in got if isinstance(i, Commit | Heartbeat)]
        positions += [bpos(e.position) for e in changes(got)]
        assert all(p > cut for p in positions)  # the runner's own filter drops nothing
        assert all(p.epoch == bpos(cut).epoch + 1 for p in positions)
        assert all(p.file.startswith("replica-log.") for p in positions)
        # The replica's positions carry its own coordinates and the same GTIDs.
        resumed = {(bpos(e.position).gtid, bpos(e.position).index) for e in changes(got)}
        logged = {(bpos(e.position).gtid, bpos(e.position).index) for e in evs}
        assert {(g, i) for g, i in resumed if (g, i) in logged} == {
            (bpos(e.position).gtid, bpos(e.position).index)
            for e in evs
            if e.after and e.after["id"] in expected
        }


def test_positions_after_a_resume_on_the_replica_resume_exactly(
    pair: tuple[TestServer, TestServer],
) -> None:
    """The replica's binlog starts with its own transaction (not in the checkpoint's GTID
    state), so the server sends it *before* the resumed transaction. A checkpoint taken at
    any position yielded from then on must still not repeat the rows logged before the
    failover (seen on MySQL: a Heartbeat for the replica's own transaction lost the
    resumed transaction's logged part, and the next restart logged it twice)."""
    primary, replica = pair
    db = new_database(primary, replica)
    primary.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(primary, db)
    try:
        run_sql(primary, db, "INSERT INTO t VALUES (1), (2), (3), (4)")
        evs = changes(read_until(stream, commits(1)))
    finally:
        src.close()
    replica.wait_caught_up(primary)
    cut = evs[1].position  # ids 1 and 2 are logged
    src, stream = opened(replica, db, Checkpoint(cut))
    try:
        run_sql(primary, db, "INSERT INTO t VALUES (5)")
        resumed = read_until(
            stream, lambda items: any(e.after == {"id": 5} for e in changes(items))
        )
    finally:
        src.close()
    assert [e.after["id"] for e in changes(resumed) if e.after] == [3, 4, 5]
    for k, item in enumerate(resumed):
        if not isinstance(item, Heartbeat | Commit | ChangeEvent):
            continue
        rest = [e.after["id"] for e in changes(resumed[k + 1 :]) if e.after]
        marker = 100 + k
        src, stream = opened(replica, db, Checkpoint(item.position))
        try:
            run_sql(primary, db, f"INSERT INTO t VALUES ({marker})")
            want = {"id": marker}
            again = read_until(
                stream, lambda items: any(e.after == want for e in changes(items))  # noqa: B023
            )
        finally:
            src.close()
        ids = [e.after["id"] for e in changes(again) if e.after]
        # exactly what followed that position, then the markers written since
        assert [i for i in ids if i < 100] == rest, (item, ids)
        assert len(ids) == len(set(ids)), (item, ids)


def test_replica_behind_the_checkpoint_is_a_clear_error(pair: tuple[TestServer, TestServer]) -> None:
    primary, replica = pair
    db = new_database(primary, replica)
    primary.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    replica.execute("STOP SLAVE")  # the replica falls behind
    try:
        src, stream = opened(primary, db)
        try:
            run_sql(primary, db, "INSERT INTO t VALUES (1), (2)")
            commit = next(i for i in read_until(stream, commits(1)) if isinstance(i, Commit))
        finally:
            src.close()
        # MariaDB's dump refuses the state (at the first read); MySQL's would wait and
        # then skip what the replica applies later, so the source refuses it at open.
        src, _ = make(replica, db)
        try:
            with pytest.raises(SourceError) as err:
                src.open(Checkpoint(commit.position))
                next(i for i in src.stream() if not isinstance(i, Heartbeat))
        finally:
            src.close()
    finally:
        replica.execute("START SLAVE")
    msg = str(err.value) + str(err.value.hint)
    assert "the server is behind it" in msg and "wait until it has caught up" in msg
    assert "fresh [log] path" in msg and "root:root" not in msg


def seq_writer(server: TestServer, db: str, stop: threading.Event, seed: int) -> None:
    """Small transactions of inserts into ``wseq`` (AUTO_INCREMENT ids): every id must be
    in the change log exactly once."""
    rng = random.Random(seed)
    conn = server.connect(db)
    conn.autocommit(False)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                for _ in range(rng.randrange(1, 6)):
                    cur.execute("INSERT INTO wseq (k) VALUES (%s)", (rng.randrange(1000),))
                conn.commit()
    finally:
        conn.close()


def loads(server: TestServer, db: str, seed: int) -> tuple[Load, Load]:
    """The oracle's random transactions (``seed``) and ``wseq``'s inserts (``seed + 1``),
    as loads for ``writing``."""
    return (lambda stop: writer(server, db, stop, seed),
            lambda stop: seq_writer(server, db, stop, seed + 1))


def rows_of(server: TestServer, db: str, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table as the chunk reader maps it, keyed as ``materialize`` keys it."""
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.{table}")
        assert info is not None
        top = reader.max_key(info, None)
        rows = reader.read_chunk(info, None, top, 10**9, None) if top is not None else []
    finally:
        reader.close()
    return {tuple(r[k] for k in KEYS.get(table, ("id",))): r for r in rows}


def checkpoint_of(config: Path) -> dict[str, Any]:
    reader = SqliteChangeLogReader(config.parent / "data")
    try:
        cp = reader.last_checkpoint()
    finally:
        reader.close()
    assert cp is not None and cp.position is not None
    return cp.position.to_json()


# ~1.5 min a flavour: MySQL 5.7's run is in the slow set (`pytest -m slow`); the source-level
# GTID resume tests above run on it by default.
@pytest.mark.parametrize(
    "fresh_pair", ["mariadb", pytest.param("mysql57", marks=pytest.mark.slow)], indirect=True
)
def test_run_fails_over_to_replica(
    fresh_pair: tuple[TestServer, TestServer], tmp_path: Path
) -> None:
    """`dblog run` on the primary under load, killed twice (the last checkpoint anywhere,
    often inside a transaction); the replica catches up and is promoted; `dblog run` is
    pointed at it and killed once more under load there. The change log equals the
    replica's tables, every row change is in it once (by GTID and index), and every
    AUTO_INCREMENT insert of ``wseq`` exactly once."""
    primary, replica = fresh_pair
    db = new_database(primary, replica)
    setup_tables(primary, db)
    primary.execute("CREATE TABLE wseq (id INT AUTO_INCREMENT PRIMARY KEY, k INT)", db)
    config = write_config(tmp_path, primary, db, "batch_max_events = 40")
    procs = [start_run(config)]
    epochs: list[int] = []

    def kill() -> None:
        kill9(procs[-1])
        epochs.append(checkpoint_of(config).get("e", 0))

    def restart() -> None:
        procs.append(start_run(config))

    def resumed() -> None:  # by GTID (a new epoch), after the last kill
        wait_for(lambda: checkpoint_of(config).get("e", 0) > epochs[-1], 30, "a GTID resume")

    def after_a_restart(n: int, rng: object) -> None:
        if n > 0:
            resumed()

    def note() -> str:
        return f"checkpoint epoch {epochs[-1]}"

    # Killed 0.5-1 s into the load, restarted 0.3 s later (writes while it is down), and
    # killed again 0.5-1 s after its GTID resume: the primary "fails" with capture down.
    seed = kill_seed(21)
    with writing(*loads(primary, db, 21)):
        on_primary = kill_and_restart(
            kill, restart, 2, seed, delay=(0.5, 1.0), down=(0.3, 0.3),
            each_round=after_a_restart, restart_last=False, note=note)
    before = checkpoint_of(config)
    assert before["file"].startswith("primary-bin.") and "gtids" in before, on_primary
    replica.wait_caught_up(primary)
    primary.stop()
    replica.promote()

    config.write_text(config.read_text().replace(primary.dsn(db), replica.dsn(db)))
    restart()

    def failed_over(n: int, rng: object) -> None:
        wait_for(lambda: checkpoint_of(config)["file"].startswith("replica-log."), 30,
                 "failover")

    failed: AssertionError | None = None
    try:
        # Killed 0.5-1 s after the capture followed the replica and restarted at once;
        # the load runs on 0.5 s after its GTID resume.
        with writing(*loads(replica, db, 22)):
            on_replica = kill_and_restart(kill, restart, 1, seed + 1, delay=(0.5, 1.0),
                                          each_round=failed_over, note=note)
            with reporting(on_primary, on_replica):
                resumed()
            time.sleep(0.5)
        events = catch_up(config, replica, db)
    except AssertionError as exc:
        failed = exc
    finally:
        code, err = stop_run(procs[-1])
    if failed is not None:  # with what dblog run said (it may have stopped)
        raise AssertionError(f"{failed}; dblog run exited {code}: {err[-4000:]}") from failed
    assert code == 0, err[-3000:]
    with reporting(on_primary, on_replica):
        after = checkpoint_of(config)
        assert after["file"].startswith("replica-log.") and after["e"] >= before.get("e", 0) + 2
        got = materialize(events)
        for table in [*TABLES, "wseq"]:
            assert got.get(table, {}) == rows_of(replica, db, table), f"{table} differs"
        logged = [e for e in events if e["source"]["snapshot"] == "false"]
        ids = [(e["source"]["gtid"], e["source"]["index"]) for e in logged]
        assert len(ids) == len(set(ids)), "a row change was logged twice"
        inserted = [e["key"]["id"] for e in logged if e["source"]["table"] == "wseq"]
        assert all(e["op"] == "c" for e in logged if e["source"]["table"] == "wseq")
        on_server = {int(r[0]) for r in replica.execute("SELECT id FROM wseq", db)}
        assert sorted(inserted) == sorted(on_server) and len(on_server) > 50
        files = {e["source"]["file"].split(".")[0] for e in logged}
        assert files == {"primary-bin", "replica-log"}
