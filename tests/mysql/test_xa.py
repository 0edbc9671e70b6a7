"""XA transactions in the binlog (MariaDB and MySQL 5.7).

An XA transaction's rows are written to the binlog at ``XA PREPARE`` but commit (or
vanish) only at a later, separate ``XA COMMIT`` / ``XA ROLLBACK`` group. pydblog used to
log them at the PREPARE as committed: a rolled-back XA transaction left phantom rows in
the change log, and a snapshot chunk read between PREPARE and COMMIT logged the old row
after the new one (review E). Until prepared transactions are held to their COMMIT, a
prepared XA transaction that changes captured tables stops capture with a clear error
before any of its rows is logged (and again after a restart); ``XA COMMIT ... ONE
PHASE`` and XA transactions on other tables are captured as usual.
"""

from __future__ import annotations

from pathlib import Path

from pydblog.errors import SourceError
from tests.contract.capture import Capture
from tests.helpers import start_run, stop_run, wait_for
from tests.mysql.harness import MariaHarness
from tests.mysql.servers import Server


def _t1(events: list[dict]) -> list[tuple[str, object, object]]:  # type: ignore[type-arg]
    return [
        (e["op"], e["key"]["id"], (e.get("after") or {}).get("v"))
        for e in events
        if e.get("source", {}).get("table") == "t1"
    ]


def _stops_on_xa(cap: Capture) -> str:
    """The run exits by itself with a SourceError naming the XA PREPARE."""
    proc = cap.proc
    assert proc is not None
    wait_for(lambda: proc.poll() is not None, 60, "dblog run to stop at the XA PREPARE")
    code, err = stop_run(proc)
    cap.proc = None
    assert code == SourceError.exit_code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "XA PREPARE" in err and "two-phase XA" in err, err[-3000:]
    return err


def test_xa_rollback_after_prepare_logs_nothing(server: Server, db: str, tmp_path: Path) -> None:
    """Review E, repro 1: XA PREPARE then XA ROLLBACK. Before: the change log held the
    rolled-back insert and update ('1 extra, 1 differ'). Now: capture stops at the
    PREPARE with nothing of it logged, and stops there again after a restart."""
    h = MariaHarness(server, db)
    h.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(20))", "INSERT INTO t1 VALUES (1, 'kept')")
    with Capture(h, tmp_path, "") as cap:
        cap.caught_up()
        h.execute("XA START 'x1'", "INSERT INTO t1 VALUES (2, 'phantom')",
                  "UPDATE t1 SET v = 'phantom' WHERE id = 1",
                  "XA END 'x1'", "XA PREPARE 'x1'", "XA ROLLBACK 'x1'")
        _stops_on_xa(cap)
        assert not [e for e in _t1(cap.events()) if e[2] == "phantom"], _t1(cap.events())
        # The checkpoint stayed before the XA transaction: a restart stops there again.
        proc = start_run(cap.config, wait=False)
        cap.proc = proc
        err = _stops_on_xa(cap)
        assert "x1" in err
        assert not [e for e in _t1(cap.events()) if e[2] == "phantom"], _t1(cap.events())


def test_xa_prepared_during_a_snapshot_stops_capture(server: Server, db: str, tmp_path: Path) -> None:
    """Review E, repro 2 (in part): an UPDATE prepared with XA PREPARE (detached) is not
    logged as committed; before, it was logged at once and a later snapshot chunk logged
    the old row after it."""
    h = MariaHarness(server, db)
    h.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(20))",
              "INSERT INTO t1 VALUES (1, 'old'), (2, 'old'), (3, 'old')")
    with Capture(h, tmp_path, '[snapshot]\nwatermark = "table"') as cap:
        cap.caught_up()
        xa = server.connect(db)
        xa.autocommit(True)
        try:
            with xa.cursor() as cur:
                for sql in ("XA START 'x2'", "UPDATE t1 SET v = 'new' WHERE id = 2",
                            "XA END 'x2'", "XA PREPARE 'x2'"):
                    cur.execute(sql)
            _stops_on_xa(cap)
            assert ("u", 2, "new") not in _t1(cap.events())
        finally:
            with xa.cursor() as cur:
                cur.execute("XA ROLLBACK 'x2'")
            xa.close()


def test_xa_one_phase_and_xa_on_other_tables_are_captured(
    server: Server, db: str, tmp_path: Path
) -> None:
    """``XA COMMIT ... ONE PHASE`` commits at once: captured like any transaction. A
    two-phase XA transaction on a table outside the captured database passes (its
    PREPARE, COMMIT and ROLLBACK groups carry nothing to log)."""
    h = MariaHarness(server, db)
    other = f"{db}_xa_other"
    h.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(20))", "INSERT INTO t1 VALUES (1, 'a')")
    server_admin = server.connect(db)
    server_admin.autocommit(True)
    try:
        with server_admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {other}")
            cur.execute(f"CREATE TABLE {other}.o (id INT PRIMARY KEY, v VARCHAR(20))")
        with Capture(h, tmp_path, "") as cap:
            cap.caught_up()
            h.execute("XA START 'one'", "INSERT INTO t1 VALUES (2, 'one')",
                      "UPDATE t1 SET v = 'one' WHERE id = 1",
                      "XA END 'one'", "XA COMMIT 'one' ONE PHASE")
            with server_admin.cursor() as cur:
                for xid, end in (("c", "XA COMMIT 'c'"), ("r", "XA ROLLBACK 'r'")):
                    cur.execute(f"XA START '{xid}'")
                    cur.execute(f"INSERT INTO {other}.o VALUES ({len(xid) + ord(xid)}, 'x')")
                    cur.execute(f"XA END '{xid}'")
                    cur.execute(f"XA PREPARE '{xid}'")
                    cur.execute(end)
            h.execute("INSERT INTO t1 VALUES (3, 'after')")
            events = cap.assert_oracle({"t1": ["id"]})
            assert ("c", 2, "one") in _t1(events) and ("u", 1, "one") in _t1(events)
            assert cap.proc is not None and cap.proc.poll() is None
    finally:
        with server_admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {other}")
        server_admin.close()


def test_fresh_start_warns_about_prepared_xa_transactions(
    server: Server, db: str, tmp_path: Path
) -> None:
    """An XA transaction prepared before a fresh start has its rows in the binlog before
    the start position: its XA COMMIT would commit changes capture never sees. The
    fresh start names it in a warning (``XA RECOVER``)."""
    h = MariaHarness(server, db)
    h.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(20))", "INSERT INTO t1 VALUES (1, 'a')")
    xa = server.connect(db)
    xa.autocommit(True)
    try:
        with xa.cursor() as cur:
            for sql in ("XA START 'early'", "UPDATE t1 SET v = 'b' WHERE id = 1",
                        "XA END 'early'", "XA PREPARE 'early'"):
                cur.execute(sql)
        cap = Capture(h, tmp_path, "").start()
        err = cap.stop()
        assert "prepared XA transaction" in err and "'early'" in err, err[-3000:]
    finally:
        with xa.cursor() as cur:
            cur.execute("XA ROLLBACK 'early'")
        xa.close()
