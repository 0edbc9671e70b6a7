"""MySQL 5.7 writes no column names into the binlog (no binlog_row_metadata): they come
from information_schema, which shows the table as it is *now*. These tests read the binlog
while it lags behind schema changes: rows are named by their own table version, or the
source stops with a clear error; never named by another version."""

from __future__ import annotations

import pytest

from pydblog.devtools.mysql57 import MySQL57
from pydblog.errors import SourceError
from pydblog.ports import Checkpoint, Heartbeat, SchemaChanged
from pydblog.sources.mysql.gtid import MySqlGtidSet
from tests.mysql.helpers import bpos, changes, commits, opened, read_until, run_sql


def test_lagging_behind_add_column_names_both_versions(mysql57: MySQL57, my57_db: str) -> None:
    db = my57_db
    mysql57.execute("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10))", db)
    src, stream = opened(mysql57, db)
    try:
        # All written before capture reads any of it: the first rows' TABLE_MAP has two
        # columns, information_schema already three.
        run_sql(mysql57, db, "INSERT INTO t VALUES (1, 'x')")
        mysql57.execute("ALTER TABLE t ADD COLUMN n INT UNSIGNED, ADD INDEX (a)", db)
        run_sql(mysql57, db, "INSERT INTO t VALUES (2, 'y', 4000000000)")
        items = read_until(stream, commits(2))
    finally:
        src.close()
    assert [e.after for e in changes(items)] == [
        {"id": 1, "a": "x"},
        {"id": 2, "a": "y", "n": 4000000000},
    ]
    schemas = [i.table_schema for i in items if isinstance(i, SchemaChanged)]
    assert [[c.name for c in s.columns] for s in schemas] == [["id", "a"], ["id", "a", "n"]]
    assert [s.key for s in schemas] == [("id",), ("id",)]


RENAMING = [
    "ALTER TABLE t CHANGE a b VARCHAR(10)",  # same types, other name
    "ALTER TABLE t DROP COLUMN a, ADD COLUMN b VARCHAR(10)",
    "ALTER TABLE t MODIFY n INT UNSIGNED",  # same binlog type, other signedness
    # another table of the same shape under the old name
    "ALTER TABLE t RENAME TO t_old; CREATE TABLE t (id INT PRIMARY KEY, b VARCHAR(10), n INT)",
]


@pytest.mark.parametrize("ddl", RENAMING)
def test_lagging_behind_a_renaming_alter_named_by_the_schema_history(
    mysql57: MySQL57, my57_db: str, ddl: str
) -> None:
    """The schema history (read at the fresh start, moved on by the DDL in the stream)
    names the rows written before the DDL with the columns they had."""
    db = my57_db
    mysql57.execute("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10), n INT)", db)
    src, stream = opened(mysql57, db)
    try:
        run_sql(mysql57, db, "INSERT INTO t VALUES (1, 'x', 5)")
        for statement in ddl.split("; "):
            mysql57.execute(statement, db)
        col = "b" if " b " in ddl else "a"
        run_sql(mysql57, db, f"INSERT INTO t (id, {col}, n) VALUES (2, 'y', 6)")
        # (a RENAME's resets commit on their own: wait for the row, not a commit count)
        items = read_until(stream, lambda items: any(
            e.after is not None and e.after.get("id") == 2 for e in changes(items)))
    finally:
        src.close()
    evs = changes(items)
    assert evs[0].after == {"id": 1, "a": "x", "n": 5}
    assert evs[1].after is not None and evs[1].after[col] == "y"


@pytest.mark.parametrize("ddl", RENAMING)
def test_lagging_behind_a_renaming_alter_without_history_is_a_clear_error(
    mysql57: MySQL57, my57_db: str, ddl: str
) -> None:
    """A change log written without a schema history (an older pydblog) resumes with
    information_schema's definitions, and stops where they cannot be the rows' own."""
    db = my57_db
    mysql57.execute("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10), n INT)", db)
    src, stream = opened(mysql57, db)
    try:
        items = read_until(stream, lambda items: any(isinstance(i, Heartbeat) for i in items))
    finally:
        src.close()
    start = next(i.position for i in items if isinstance(i, Heartbeat))
    run_sql(mysql57, db, "INSERT INTO t VALUES (1, 'x', 5)")
    for statement in ddl.split("; "):
        mysql57.execute(statement, db)
    src, stream = opened(mysql57, db, Checkpoint(start))
    try:
        with pytest.raises(SourceError) as err:
            read_until(stream, commits(1))
    finally:
        src.close()
    msg = f"{err.value} {err.value.hint}"
    assert f"rows of {db}.t" in msg and ddl.split(" t ")[1][:12] in msg
    assert "binlog_row_metadata" in msg and "fresh [log] path" in msg
    assert "root:root" not in msg


def test_keeping_up_through_renames_and_drops(mysql57: MySQL57, my57_db: str) -> None:
    """The same DDL is harmless while capture keeps up: each DDL read in the stream drops
    the cached definition, and the next rows are named by the new one."""
    db = my57_db
    mysql57.execute("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10), n INT)", db)
    src, stream = opened(mysql57, db)
    try:
        run_sql(mysql57, db, "INSERT INTO t VALUES (1, 'x', -5)")
        items = read_until(stream, commits(1))
        mysql57.execute("ALTER TABLE t CHANGE a b VARCHAR(10)", db)
        run_sql(mysql57, db, "INSERT INTO t VALUES (2, 'y', 6)", "DELETE FROM t WHERE id = 1")
        items += read_until(stream, commits(1))
        mysql57.execute("ALTER TABLE t MODIFY n INT UNSIGNED", db)
        run_sql(mysql57, db, "UPDATE t SET n = 4000000000 WHERE id = 2")
        items += read_until(stream, commits(1))
    finally:
        src.close()
    evs = changes(items)
    assert evs[0].after == {"id": 1, "a": "x", "n": -5}
    assert evs[1].after == {"id": 2, "b": "y", "n": 6}
    assert evs[2].before == {"id": 1, "b": "x", "n": -5}
    assert (evs[3].before, evs[3].after) == (
        {"id": 2, "b": "y", "n": 6},
        {"id": 2, "b": "y", "n": 4000000000},
    )


def test_fresh_start_does_not_read_the_binlog_file(
    mysql57: MySQL57, my57_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh start with GTIDs asks the server for the transactions after its executed
    GTID set (no scan of the current binlog file to learn the set at an offset, which
    cost ~0.2 s per MB). Transactions committing while it starts are captured once."""
    import pydblog.sources.mysql.server as server_mod

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("the binlog file was scanned for the GTID state")

    monkeypatch.setattr(server_mod, "mysql_state_at", no_scan)
    db = my57_db
    mysql57.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", db)
    for i in range(50):  # some history in the current file before the start
        run_sql(mysql57, db, f"INSERT INTO t VALUES ({i}, 'old')")
    src, stream = opened(mysql57, db)
    try:
        with mysql57.admin() as cur:
            cur.execute("SELECT @@GLOBAL.gtid_executed")
            executed = str(cur.fetchone()[0])
        run_sql(mysql57, db, "INSERT INTO t VALUES (100, 'new')", "UPDATE t SET v = 'x' WHERE id = 1")
        items = read_until(stream, commits(1))
    finally:
        src.close()
    start = next(i for i in items if isinstance(i, Heartbeat))
    assert bpos(start.position).gtids == MySqlGtidSet.parse(executed)
    evs = changes(items)
    assert [(e.op.value, e.key) for e in evs] == [("c", {"id": 100}), ("u", {"id": 1})]
    assert all(start.position < e.position for e in evs)
    # A restart at the start position resumes there exactly.
    src, stream = opened(mysql57, db, Checkpoint(start.position))
    try:
        again = read_until(stream, commits(1))
    finally:
        src.close()
    assert [(e.op, e.key, e.after) for e in changes(again)] == [
        (e.op, e.key, e.after) for e in evs
    ]
