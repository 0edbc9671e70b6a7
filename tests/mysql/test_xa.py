"""XA transactions in the binlog (MariaDB 10.11 and MySQL 5.7).

An XA transaction's rows are written to the binlog at ``XA PREPARE`` but commit (or
vanish) only at a later, separate ``XA COMMIT`` / ``XA ROLLBACK`` group. Logged at the
PREPARE as committed, a rolled-back XA transaction would leave phantom rows in the change
log, and a snapshot chunk read between PREPARE and COMMIT would log the old row after
the new one. So the source holds a prepared transaction's rows (in the checkpoint too) and logs them at its ``XA COMMIT`` group, as one transaction there, or
drops them at its ``XA ROLLBACK`` (``sources.mysql.xa``). The oracle: materialize the log
and compare it with the tables, every column.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pydblog.devtools.mysql57 import MySQL57
from pydblog.sources.mysql.xa import recover_xids, xid_text
from tests.chaos import StepKills, kill_seed, reporting
from tests.contract.capture import Capture
from tests.contract.test_read_only import ReadOnlyUser
from tests.helpers import sid, stop_run
from tests.mysql.harness import MariaHarness
from tests.mysql.servers import Server, require_mysql57

T1 = "CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(20), n INT)"


def _t1(events: list[dict[str, Any]]) -> list[tuple[str, object, object]]:
    return [
        (e["op"], e["key"]["id"], (e.get("after") or {}).get("v"))
        for e in events
        if e.get("source", {}).get("table") == "t1" and e["op"] != "n"
    ]


@contextmanager
def _session(server: Server, db: str) -> Iterator[Any]:
    """A connection for XA statements; an XA transaction it left prepared (a failed
    test) is rolled back at the end (a prepared one outlives its connection and would
    hold its locks into the next tests)."""
    conn = server.connect(db)
    conn.autocommit(True)
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        with contextlib.suppress(Exception), conn.cursor() as cur:
            cur.execute("XA RECOVER")
            for xid in recover_xids(cur.fetchall()):
                with contextlib.suppress(Exception):
                    cur.execute(f"XA ROLLBACK {xid_text(xid)}")
        conn.close()


def _prepare(cur: Any, xid: str, *statements: str) -> None:
    cur.execute(f"XA START {xid}")
    for sql in statements:
        cur.execute(sql)
    cur.execute(f"XA END {xid}")
    cur.execute(f"XA PREPARE {xid}")


def test_xa_commit_and_rollback_are_exact(server: Server, db: str, tmp_path: Path) -> None:
    """PREPARE then ROLLBACK (logged at the PREPARE: '1 extra, 1 differ'), and a
    committed one interleaved with ordinary transactions: the rolled-back rows are never
    logged; the committed ones are logged at the XA COMMIT, after what committed between
    PREPARE and COMMIT, as one transaction there (one GTID); an xid with bqual and
    formatID is matched too. ``XA COMMIT ... ONE PHASE`` commits at once (captured like
    any transaction), and two-phase XA transactions on a table outside the captured
    database pass (nothing to log)."""
    h = MariaHarness(server, db)
    other = f"{db}_xa_other"
    h.execute(T1, "INSERT INTO t1 VALUES (1, 'kept', 0), (2, 'two', 0)")
    server.execute(f"CREATE DATABASE {other}")
    try:
        with Capture(h, tmp_path, "") as cap, _session(server, db) as xa:
            cap.caught_up()
            _prepare(xa, "'x1'", "INSERT INTO t1 VALUES (3, 'phantom', 0)",
                     "UPDATE t1 SET v = 'phantom' WHERE id = 1")
            xa.execute("XA ROLLBACK 'x1'")
            _prepare(xa, "'x2', 'b q', 7", "UPDATE t1 SET v = 'xa', n = n + 1 WHERE id = 2",
                     "INSERT INTO t1 VALUES (4, 'xa', 4)", "DELETE FROM t1 WHERE id = 1")
            h.execute("INSERT INTO t1 VALUES (5, 'between', 5)")
            cap.caught_up()
            assert ("u", 2, "xa") not in _t1(cap.events())  # prepared, not committed
            xa.execute("XA COMMIT 'x2', 'b q', 7")
            xa.execute(f"CREATE TABLE {other}.o (id INT PRIMARY KEY, v VARCHAR(20))")
            for xid, end in (("'c'", "COMMIT"), ("'r'", "ROLLBACK")):
                _prepare(xa, xid, f"INSERT INTO {other}.o VALUES ({len(end)}, 'x')")
                xa.execute(f"XA {end} {xid}")
            h.execute("XA START 'one'", "INSERT INTO t1 VALUES (6, 'one', 6)",
                      "UPDATE t1 SET v = 'one' WHERE id = 5",
                      "XA END 'one'", "XA COMMIT 'one' ONE PHASE")
            events = cap.assert_oracle({"t1": ["id"]})
    finally:
        server.execute(f"DROP DATABASE IF EXISTS {other}")
    t1 = _t1(events)
    assert not [e for e in t1 if e[2] == "phantom"], t1
    assert t1.index(("u", 2, "xa")) > t1.index(("c", 5, "between")), t1
    assert t1[-2:] == [("c", 6, "one"), ("u", 5, "one")], t1
    committed = [e for e in events if e.get("source", {}).get("table") == "t1"
                 and e["op"] != "r" and e["key"]["id"] in (1, 2, 4)]
    tail = committed[-3:]
    assert [(e["op"], e["key"]["id"]) for e in tail] == [("u", 2), ("c", 4), ("d", 1)], t1
    assert len({(e["source"]["file"], e["source"]["pos"], e["source"]["gtid"]) for e in tail}) == 1
    assert [e["source"]["index"] for e in tail] == [0, 1, 2]


@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_snapshot_chunk_between_prepare_and_commit(
    server: Server, db: str, tmp_path: Path, watermark: str
) -> None:
    """A chunk read while an UPDATE is prepared reads the old row
    (prepared changes are invisible); the UPDATE is logged at its XA COMMIT, after the
    chunk's window, so the log ends with the new row (logged at the PREPARE, the chunk's
    old row would follow it, for good)."""
    inner = MariaHarness(server, db)
    h = ReadOnlyUser(inner) if watermark == "read-only" else inner
    inner.execute(T1, "INSERT INTO t1 VALUES (1, 'old', 1), (2, 'old', 2), (3, 'old', 3)")
    config = f'[snapshot]\nwatermark = "{watermark}"\nchunk_size = 2'
    with Capture(h, tmp_path, config) as cap, _session(server, db) as xa:
        cap.caught_up()
        _prepare(xa, "'x2'", "UPDATE t1 SET v = 'new', n = 20 WHERE id = 2",
                 "DELETE FROM t1 WHERE id = 3")
        h.signal(sid(), "execute-snapshot", {"data-collections": [f"{db}\\.t1"]})
        cap.wait_notification("COMPLETED", timeout=60)
        read = {(e["key"]["id"], e["after"]["v"]) for e in cap.events()
                if e["op"] == "r" and e["source"]["table"] == "t1"}
        assert read == {(1, "old"), (2, "old"), (3, "old")}, read
        xa.execute("XA COMMIT 'x2'")
        events = cap.assert_oracle({"t1": ["id"]})
    t1 = _t1(events)
    assert t1[-2:] == [("u", 2, "new"), ("d", 3, None)], t1


def test_kill9_while_prepared(server: Server, db: str, tmp_path: Path) -> None:
    """kill -9 while two XA transactions are prepared (their rows only in the
    checkpoint): one commits and a third is prepared and committed while capture is
    down, the second rolls back after the restart; a kill -9 once more right after a
    commit was logged. The log holds every committed change once, nothing rolled back.
    (Resumes by GTID: MariaDB always, this MySQL 5.7 with gtid_mode = ON.)"""
    _kill9_while_prepared(server, db, tmp_path)


@pytest.mark.slow
def test_kill9_while_prepared_gtid_mode_off(tmp_path: Path) -> None:
    """The same on MySQL 5.7 with gtid_mode = OFF: resumes by binlog file and offset
    (the XA COMMIT group is read again from its start, its logged part dropped by
    position)."""
    require_mysql57()
    with MySQL57(server_id=8, settings={"gtid_mode": "OFF",
                                        "enforce_gtid_consistency": "OFF"}) as s:
        s.create_database("xa_nogtid")
        _kill9_while_prepared(s, "xa_nogtid", tmp_path)


def _kill9_while_prepared(server: Server, db: str, tmp_path: Path) -> None:
    h = MariaHarness(server, db)
    h.execute(T1)
    cap = Capture(h, tmp_path, "")
    with cap, _session(server, db) as k1, _session(server, db) as k2, _session(server, db) as k3:
        cap.caught_up()
        h.execute("INSERT INTO t1 VALUES (1, 'a', 1), (2, 'a', 2), (3, 'a', 3)")
        _prepare(k1, "'k1'", "UPDATE t1 SET v = 'k1' WHERE id = 1",
                 "INSERT INTO t1 VALUES (10, 'k1', 10)")
        _prepare(k2, "'k2'", "DELETE FROM t1 WHERE id = 3", "UPDATE t1 SET v = 'k2' WHERE id = 2")
        h.execute("INSERT INTO t1 VALUES (20, 'plain', 20)")
        cap.caught_up()  # a checkpoint after both PREPAREs is durable
        cap.kill()
        k1.execute("XA COMMIT 'k1'")
        _prepare(k3, "'k3'", "INSERT INTO t1 VALUES (11, 'k3', 11)")
        k3.execute("XA COMMIT 'k3'")
        cap.start()
        cap.caught_up()
        k2.execute("XA ROLLBACK 'k2'")
        _prepare(k1, "'k4'", "UPDATE t1 SET v = 'k4', n = 4 WHERE id = 2")
        k1.execute("XA COMMIT 'k4'")
        cap.wait_until(lambda ev: ("u", 2, "k4") in _t1(ev), 60, "k4's update")
        cap.kill()
        cap.start()
        events = cap.assert_oracle({"t1": ["id"]})
    t1 = _t1(events)
    assert not [e for e in t1 if e[2] == "k2"], t1
    for change in (("u", 1, "k1"), ("c", 10, "k1"), ("c", 11, "k3"), ("u", 2, "k4")):
        assert t1.count(change) == 1, (change, t1)


def test_xa_prepared_before_a_fresh_start(server: Server, db: str, tmp_path: Path) -> None:
    """An XA transaction prepared before a fresh start has its rows in the binlog before
    the start position: its XA COMMIT commits changes capture never saw. The fresh start
    names it in a warning (``XA RECOVER``), and so does its commit, asking for a
    snapshot; the snapshot then logs the rows as committed."""
    h = MariaHarness(server, db)
    h.execute(T1, "INSERT INTO t1 VALUES (1, 'a', 1), (2, 'a', 2)")
    with _session(server, db) as xa:
        _prepare(xa, "'early'", "UPDATE t1 SET v = 'b' WHERE id = 1")
        cap = Capture(h, tmp_path, "").start()
        try:
            cap.caught_up()
            xa.execute("XA COMMIT 'early'")
            h.signal(sid(), "execute-snapshot", {"data-collections": [f"{db}\\.t1"]})
            cap.wait_notification("COMPLETED", timeout=60)
            cap.assert_oracle({"t1": ["id"]})
        finally:
            err = cap.stop()
    assert "prepared XA transaction" in err and "'early'" in err, err[-3000:]
    assert "X'6561726c79',X'',1, prepared before capture started, committed" in err, err[-3000:]


@pytest.mark.slow
def test_xa_under_kill9_at_random_points(server: Server, db: str, tmp_path: Path) -> None:
    """Ordinary transactions and XA transactions (prepared, then committed or rolled
    back, two sessions with their own keys so that their row locks never block the
    rest) while capture is killed with -9 at random points and restarted; some steps run
    while it is down. The log ends equal to the table, no position twice."""
    h = MariaHarness(server, db)
    h.execute(T1)
    cap = Capture(h, tmp_path, "")
    with cap, _session(server, db) as a, _session(server, db) as b:
        for cur in (a, b):  # no gap locks: an XA's DELETE of a missing key would block
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cap.caught_up()
        sessions: list[list[Any]] = [[a, None, 100], [b, None, 200]]  # cursor, open xid, base
        # Five kills at steps 10-149 (0-0.3 s into the step), each down for 1-6 steps.
        kills = StepKills(cap.kill, cap.start, kill_seed(11), range(10, 150), 5)
        rng = kills.rng  # the workload's steps come from the same seed
        for step in range(150):
            kills.at(step)
            if rng.random() < 0.4:
                k = rng.randint(1, 40)
                h.execute(f"INSERT INTO t1 VALUES ({k}, 'p{step}', {step}) "
                          f"ON DUPLICATE KEY UPDATE v = 'p{step}', n = {step}")
                continue
            s = rng.choice(sessions)
            cur, xid, base = s
            if xid is not None:
                cur.execute(f"XA {'COMMIT' if rng.random() < 0.7 else 'ROLLBACK'} {xid}")
                s[1] = None
                continue
            xid = f"'s{step}'"
            stmts = []
            for _ in range(rng.randint(1, 3)):
                k = base + rng.randint(0, 15)
                stmts.append(rng.choice([
                    f"INSERT INTO t1 VALUES ({k}, 'x{step}', {step}) "
                    f"ON DUPLICATE KEY UPDATE v = 'x{step}', n = {step}",
                    f"DELETE FROM t1 WHERE id = {k}",
                ]))
            _prepare(cur, xid, *stmts)
            s[1] = xid
        for s in sessions:
            if s[1] is not None:
                s[0].execute(f"XA COMMIT {s[1]}")
        kills.finish()
        with reporting(kills.done):
            cap.assert_oracle({"t1": ["id"]})


def _stopped(cap: Capture, timeout: float = 90) -> str:
    """``dblog run``'s stderr once it exits by itself (code 3: a SourceError)."""
    assert cap.proc is not None
    cap.proc.wait(timeout=timeout)
    code, err = stop_run(cap.proc)
    cap.proc = None
    assert code == 3, (code, err[-3000:])
    return err


def _big_prepare(xa: Any, xid: str, rows: int) -> None:
    xa.execute(f"XA START {xid}")
    for base in range(100, 100 + rows, 1000):
        xa.execute("INSERT INTO t1 VALUES " + ", ".join(
            f"({i}, 'held', {i})" for i in range(base, min(base + 1000, 100 + rows))))
    xa.execute(f"XA END {xid}")
    xa.execute(f"XA PREPARE {xid}")


def test_held_rows_over_the_limit_stop_capture_loudly(
    server: Server, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every checkpoint carries a prepared XA transaction's rows, so their
    encoded size is bounded (``PYDBLOG_XA_MAX_HELD_BYTES``): above it capture stops with a
    SourceError naming the xid, the size and the fix, instead of writing ever larger
    checkpoints; with the limit raised, a restart re-reads the PREPARE and the XA COMMIT
    logs its rows exactly."""
    h = MariaHarness(server, db)
    h.execute(T1)
    monkeypatch.setenv("PYDBLOG_XA_MAX_HELD_BYTES", "20000")
    with Capture(h, tmp_path, "") as cap, _session(server, db) as xa, \
            _session(server, db) as small:
        cap.caught_up()
        _prepare(small, "'small'", "INSERT INTO t1 VALUES (2, 'small', 2)")  # under the limit
        _big_prepare(xa, "'big'", 500)
        err = _stopped(cap)
        assert "XA transaction X'626967',X'',1" in err, err[-3000:]
        assert "PYDBLOG_XA_MAX_HELD_BYTES" in err and "over the limit of 20,000 bytes" in err, err[-3000:]
        monkeypatch.setenv("PYDBLOG_XA_MAX_HELD_BYTES", str(1 << 20))
        cap.start()
        xa.execute("XA COMMIT 'big'")
        small.execute("XA ROLLBACK 'small'")
        h.execute("INSERT INTO t1 VALUES (3, 'after', 3)")
        events = cap.assert_oracle({"t1": ["id"]})
    t1 = _t1(events)
    assert ("c", 2, "small") not in t1
    assert len([e for e in t1 if e[2] == "held"]) == 500


@pytest.mark.parametrize("server", ["mariadb"], indirect=True)
def test_held_rows_over_a_kafka_message_stop_capture_loudly(
    server: Server, db: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same with the Kafka change log: 8,000 held rows (~1.5 MB of checkpoint) would
    make every commit fail (message too large) and stall capture silently; the default
    limit stops it at the PREPARE with the SourceError."""
    pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")
    from tests.kafka.conftest import kafka_log_toml

    h = MariaHarness(server, db)
    h.execute(T1)
    with Capture(h, tmp_path, kafka_log_toml(request.getfixturevalue("kafka_bootstrap"))) as cap, \
            _session(server, db) as xa:
        cap.caught_up()
        _big_prepare(xa, "'big'", 8000)
        err = _stopped(cap)
    assert "XA transaction X'626967',X'',1" in err and "8000 rows" in err, err[-3000:]
    assert "Message size too large" not in err, err[-3000:]
