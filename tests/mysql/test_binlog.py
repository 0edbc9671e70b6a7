"""Binlog capture against real servers (each test on MariaDB and on MySQL 5.7, through the
``server``/``db`` fixtures): row events, transactions, DDL, resume, idle."""

from __future__ import annotations

import itertools
import time

import pytest

from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.errors import SourceError
from pydblog.events import Op
from pydblog.ports import (
    Checkpoint,
    Commit,
    Heartbeat,
    Idle,
    RelationReset,
    ResetKind,
    SchemaChanged,
    SourceState,
)
from pydblog.positions import decode_position, encode_position
from pydblog.sources.mysql.position import BEFORE_TX, BinlogPosition
from tests.mysql.helpers import bpos, changes, commits, make, opened, read_until, run_sql


def test_inserts_updates_deletes_and_transactions(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), n INT)", db)
    server.execute("CREATE TABLE other (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db, tables=[rf"{db}\.t"])
    try:
        run_sql(server, db, "INSERT INTO t VALUES (1, 'a', 0), (2, 'b', 0)")
        run_sql(
            server,
            db,
            "UPDATE t SET n = n + 1 WHERE id = 1",
            "INSERT INTO other VALUES (7)",
            "DELETE FROM t WHERE id = 2",
            "INSERT INTO t VALUES (3, NULL, 5)",
        )
        run_sql(server, db, "UPDATE t SET id = 10 WHERE id = 3")
        items = read_until(stream, commits(3))
    finally:
        src.close()
    evs = changes(items)
    assert [(e.op, e.key) for e in evs] == [
        (Op.CREATE, {"id": 1}),
        (Op.CREATE, {"id": 2}),
        (Op.UPDATE, {"id": 1}),
        (Op.DELETE, {"id": 2}),
        (Op.CREATE, {"id": 3}),
        (Op.DELETE, {"id": 3}),
        (Op.CREATE, {"id": 10}),  # a key change: d + c
    ]
    assert all(e.schema == db and e.table == "t" for e in evs)
    assert evs[2].before == {"id": 1, "v": "a", "n": 0}
    assert evs[2].after == {"id": 1, "v": "a", "n": 1}
    assert evs[3].before == {"id": 2, "v": "b", "n": 0} and evs[3].after is None
    assert evs[4].after == {"id": 3, "v": None, "n": 5}
    # Positions: strictly increasing; a transaction shares (file, pos); Commit above its events.
    positioned = [i for i in items if isinstance(i, (type(evs[0]), Commit))]
    pos = [i.position for i in positioned]
    assert all(a < b for a, b in itertools.pairwise(pos))
    tx2 = [bpos(e.position) for e in evs[2:5]]
    assert {(p.file, p.pos) for p in tx2} == {(tx2[0].file, tx2[0].pos)}
    assert [p.index for p in tx2] == [0, 1, 2]
    commit2 = [i for i in items if isinstance(i, Commit)][1]
    gtid = bpos(commit2.position).gtid
    assert bpos(commit2.position).index == 3 and gtid is not None
    if isinstance(server, MySQL57):  # uuid:n
        assert gtid.startswith(server.server_uuid() + ":")
    else:  # domain-server-seq
        assert gtid.startswith("0-1-")
    # A fresh start first offers its start position (BEFORE_TX, below everything after).
    start, first = [i for i in items if not isinstance(i, Idle | SourceState)][:2]
    assert isinstance(start, Heartbeat) and bpos(start.position).index == BEFORE_TX
    assert start.position < evs[0].position
    assert isinstance(first, SchemaChanged) and first.table_schema.key == ("id",)
    p = evs[0].position
    assert decode_position(encode_position(p)) == p
    assert p.source_fields()["gtid"] == bpos(p).gtid


def test_own_tables_truncate_and_schema(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db)
    try:
        tables = {r[0] for r in server.execute("SHOW TABLES", db)}
        assert {"dblog_signal", "dblog_watermark"} <= tables
        run_sql(server, db, "INSERT INTO dblog_signal VALUES ('s1', 'execute-snapshot', '{}')")
        run_sql(server, db, "UPDATE dblog_watermark SET value = 'w1' WHERE id = 1")
        run_sql(server, db, "INSERT INTO t VALUES (1)")
        server.execute("TRUNCATE TABLE t", db)
        items = read_until(stream, commits(4))
    finally:
        src.close()
    evs = changes(items)
    # Signal/watermark rows carry the configured names (how the runner recognises them).
    assert (evs[0].qualified_table, evs[0].after) == (
        "public.dblog_signal",
        {"id": "s1", "type": "execute-snapshot", "data": "{}"},
    )
    assert evs[1].qualified_table == "public.dblog_watermark"
    assert evs[1].after == {"id": 1, "value": "w1"}
    assert (evs[2].op, evs[3].op) == (Op.CREATE, Op.TRUNCATE)
    assert evs[3].qualified_table == f"{db}.t"
    schemas = [i for i in items if isinstance(i, SchemaChanged)]
    assert [s.table_schema.qualified for s in schemas] == [f"{db}.t"]


def test_ddl_mid_stream(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY, a INT)", db)
    src, stream = opened(server, db)
    try:
        # Capture keeps up with each step (MariaDB's JSON columns, and on MySQL 5.7 all
        # column names, come from the *current* definition: docs/mysql.md; lagging behind
        # a DROP COLUMN is test_mysql57.py's).
        run_sql(server, db, "INSERT INTO t VALUES (1, 10)")
        items = read_until(stream, commits(1))
        server.execute(
            "ALTER TABLE t ADD COLUMN b VARCHAR(10) DEFAULT 'x', ADD COLUMN j JSON", db
        )
        run_sql(server, db, "INSERT INTO t VALUES (2, 20, 'y', '[1]')")
        items += read_until(stream, commits(1))
        server.execute("ALTER TABLE t DROP COLUMN a", db)
        run_sql(server, db, "UPDATE t SET b = 'z' WHERE id = 1")
        items += read_until(stream, commits(1))
        server.execute("RENAME TABLE t TO t2", db)
        run_sql(server, db, "INSERT INTO t2 VALUES (3, 'w', '{\"k\": true}')")
        items += read_until(stream, commits(2))  # the RENAME's resets commit on their own
    finally:
        src.close()
    evs = changes(items)
    assert evs[0].after == {"id": 1, "a": 10}
    assert evs[1].after == {"id": 2, "a": 20, "b": "y", "j": [1]}
    assert evs[2].before == {"id": 1, "b": "x", "j": None}
    assert evs[2].after == {"id": 1, "b": "z", "j": None}
    assert (evs[3].table, evs[3].after) == ("t2", {"id": 3, "b": "w", "j": {"k": True}})
    resets = [(i.event.table, i.kind) for i in items if isinstance(i, RelationReset)]
    assert resets == [("t", ResetKind.GONE), ("t2", ResetKind.RECREATED)]
    schemas = [i.table_schema for i in items if isinstance(i, SchemaChanged)]
    assert [[c.name for c in s.columns] for s in schemas] == [
        ["id", "a"],
        ["id", "a", "b", "j"],
        ["id", "b", "j"],
        ["id", "b", "j"],
    ]
    assert schemas[1].columns[3].logical == "json"
    assert schemas[-1].table == "t2"


def test_resume_after_checkpoint(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db)
    try:
        run_sql(server, db, "INSERT INTO t VALUES (1), (2), (3)")
        server.execute("FLUSH BINARY LOGS")  # the next transactions are in a new file
        run_sql(server, db, "INSERT INTO t VALUES (4), (5)")
        first = read_until(stream, commits(2))
    finally:
        src.close()
    evs = changes(first)
    assert [e.after for e in evs] == [{"id": i} for i in range(1, 6)]
    assert (
        bpos(evs[3].position).file != bpos(evs[0].position).file
        and evs[0].position < evs[3].position
    )
    # Mid-transaction checkpoint: the rest of that transaction and what follows, once.
    for cut, expected_ids in ((1, [3, 4, 5]), (2, [4, 5]), (4, [])):
        src, stream = opened(server, db, Checkpoint(evs[cut].position))
        try:
            run_sql(server, db, f"INSERT INTO t VALUES ({100 + cut})")
            want = {"id": 100 + cut}
            again = read_until(stream, lambda items: any(e.after == want for e in changes(items)))  # noqa: B023
        finally:
            src.close()
        got = [e.after["id"] for e in changes(again) if e.after]
        assert [i for i in got if i < 100] == expected_ids  # each once, in order
        assert got[-1] == 100 + cut and len(got) == len(set(got))
        assert all(e.position > evs[cut].position for e in changes(again))
        # Resumed by GTID state (MariaDB always has one): a new epoch, same coordinates.
        assert bpos(evs[cut].position).gtids is not None
        assert all(bpos(e.position).epoch == bpos(evs[cut].position).epoch + 1 for e in changes(again))
        same = [e for e in changes(again) if e.after and e.after["id"] < 100]
        assert [bpos(e.position).source_fields() for e in same] == [
            bpos(e.position).source_fields()
            for e in evs
            if e.after and e.after["id"] in expected_ids
        ]
    # Resuming at a Commit position re-yields nothing of that transaction.
    commit = next(i for i in first if isinstance(i, Commit))
    src, stream = opened(server, db, Checkpoint(commit.position))
    try:
        again = read_until(stream, commits(1))
    finally:
        src.close()
    assert [e.after["id"] for e in changes(again) if e.after] == [4, 5]


def test_checkpoint_without_gtid_state_resumes_by_file(server: TestServer, db: str) -> None:
    """A change log written before GTID resume (file + offset only) resumes as before, on
    the same server, and from then on positions carry the GTID state."""
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db)
    try:
        run_sql(server, db, "INSERT INTO t VALUES (1), (2), (3)")
        run_sql(server, db, "INSERT INTO t VALUES (4)")
        first = changes(read_until(stream, commits(2)))
    finally:
        src.close()
    cut = bpos(first[1].position)
    old = BinlogPosition(cut.file, cut.pos, cut.index, cut.gtid)  # no gtids, epoch 0
    src, stream = opened(server, db, Checkpoint(old))
    try:
        again = changes(read_until(stream, commits(2)))
    finally:
        src.close()
    assert [e.after for e in again] == [{"id": 3}, {"id": 4}]
    assert [bpos(e.position).epoch for e in again] == [0, 0]
    # The state is known again (MariaDB: BINLOG_GTID_POS at the transaction's start;
    # MySQL: the file's Previous_gtids and the GTIDs before it), equal to what the first
    # read tracked.
    assert [bpos(e.position).gtids for e in again] == [bpos(e.position).gtids for e in first[2:]]
    assert all(bpos(e.position).gtids is not None for e in again)


def test_purged_gtid_state_is_a_clear_error(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db)
    try:
        run_sql(server, db, "INSERT INTO t VALUES (1)")
        commit = next(i for i in read_until(stream, commits(1)) if isinstance(i, Commit))
    finally:
        src.close()
    server.execute("FLUSH BINARY LOGS")
    run_sql(server, db, "INSERT INTO t VALUES (2)")
    server.execute("FLUSH BINARY LOGS")
    current = str(server.execute("SHOW MASTER STATUS")[0][0])
    deadline = time.monotonic() + 20
    while True:  # a file stays until InnoDB's binlog checkpoint has passed it
        server.execute(f"PURGE BINARY LOGS TO '{current}'")
        if str(server.execute("SHOW BINARY LOGS")[0][0]) == current:
            break
        assert time.monotonic() < deadline, "the binlogs were not purged"
        server.execute("FLUSH ENGINE LOGS")
        time.sleep(0.2)
    src, stream = opened(server, db, Checkpoint(commit.position))
    try:
        with pytest.raises(SourceError) as err:
            next(iter(stream))
    finally:
        src.close()
    msg = f"{err.value} {err.value.hint}"
    assert "cannot send the binlog after GTID state" in msg
    # MariaDB names its oldest binlog's state, MySQL its gtid_purged.
    assert "(purged: the server" in msg, msg
    assert "fresh [log] path" in msg and "snapshot" in msg


def test_missing_binlog_file_is_a_clear_error(server: TestServer, db: str) -> None:
    import pytest

    from pydblog.errors import SourceError

    src, _ = opened(server, db)
    src.close()
    gone = BinlogPosition("mariadb-bin.000999", 4, 0, "0-1-1")
    from tests.mysql.helpers import make

    src, _ = make(server, db)
    with pytest.raises(SourceError, match=r"mariadb-bin\.000999.*no longer on the server"):
        src.open(Checkpoint(gone))
    src.close()


def test_idle_and_heartbeat(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    server.execute("CREATE TABLE uncaptured (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db, tables=[rf"{db}\.t"], heartbeat_interval_s=0.5)
    try:
        t0 = time.monotonic()
        items = read_until(stream, lambda items: sum(isinstance(i, Idle) for i in items) >= 3)
        assert time.monotonic() - t0 < 3.0
        # Writes elsewhere move the binlog: the position advances through heartbeats.
        run_sql(server, db, "INSERT INTO uncaptured VALUES (1)")
        items = read_until(stream, lambda items: any(isinstance(i, Heartbeat) for i in items))
        hb1 = next(i for i in items if isinstance(i, Heartbeat)).position
        run_sql(server, db, "INSERT INTO uncaptured VALUES (2)")
        items = read_until(stream, lambda items: any(isinstance(i, Heartbeat) for i in items))
        hb2 = next(i for i in items if isinstance(i, Heartbeat)).position
        assert not changes(items)
        assert hb1 < hb2
        run_sql(server, db, "INSERT INTO t VALUES (1)")
        items = read_until(stream, commits(1))
        assert changes(items)[0].position > hb2
        assert src.lag_bytes() == 0
    finally:
        src.close()


def test_lost_connection_resumes_without_loss_or_duplicates(
    server: TestServer, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db)
    try:
        run_sql(server, db, "INSERT INTO t VALUES (1), (2)")
        first = read_until(stream, commits(1))
        # Kill our binlog dump on the server side (as net_write_timeout would).
        for row in server.execute("SHOW PROCESSLIST"):
            if str(row[4]).startswith("Binlog Dump"):  # MySQL: "Binlog Dump GTID"
                server.execute(f"KILL {row[0]}")
        run_sql(server, db, "INSERT INTO t VALUES (3), (4)")
        run_sql(server, db, "INSERT INTO t VALUES (5)")
        again = read_until(stream, commits(2), timeout=30)
    finally:
        src.close()
    ids = [e.after["id"] for e in changes(first + again) if e.after]
    assert ids == [1, 2, 3, 4, 5]
    # Reconnected by GTID state: the items after it are in the next epoch.
    epoch = bpos(changes(first)[0].position).epoch
    assert {bpos(e.position).epoch for e in changes(again)} == {epoch + 1}
    assert "binlog stream interrupted" in caplog.text


def test_lost_connection_before_the_resumed_transaction(server: TestServer, db: str) -> None:
    """Resuming inside a transaction, the connection is lost before that transaction is
    read again: the reconnect still drops its logged part (seen on MySQL in
    test_run_fails_over_to_replica: a whole transaction logged twice)."""
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    src, stream = opened(server, db)
    try:
        run_sql(server, db, "INSERT INTO t VALUES (1), (2), (3)")
        first = changes(read_until(stream, commits(1)))
    finally:
        src.close()
    src, _ = make(server, db)
    try:
        src.open(Checkpoint(first[0].position))
        src._restart()  # what _fetch does when the dump connection drops
        run_sql(server, db, "INSERT INTO t VALUES (4)")
        again = changes(read_until(src.stream(), commits(2)))
    finally:
        src.close()
    assert [e.after for e in again] == [{"id": 2}, {"id": 3}, {"id": 4}]
