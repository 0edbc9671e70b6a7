"""A captured MySQL/MariaDB table renamed or dropped (DDL in the binlog). Before, the
binlog source only logged TRUNCATE TABLE: a dropped table's rows stayed in the
materialized log for good, and a renamed table kept its rows under the old name while
the new name got only the changes made after the rename (silently missing the rest).
Now the old name gets a truncate at the DDL's place, and the new name a truncate and a
snapshot (like a re-created PostgreSQL table)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pydblog.devtools.mysql57 import TestServer
from pydblog.sources.mysql.ddl import parse_ddl
from tests.contract.capture import Capture
from tests.helpers import materialize, sid
from tests.mysql.harness import MariaHarness


def rows(h: MariaHarness, table: str, first: int, last: int, tag: str) -> None:
    h.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(40))",
              f"INSERT INTO {table} VALUES " + ", ".join(
                  f"({i}, '{tag}{i}')" for i in range(first, last + 1)))


@pytest.mark.parametrize("server", ["mariadb"], indirect=True)
def test_renamed_swapped_and_dropped_tables(server: TestServer, db: str, tmp_path: Path) -> None:
    h = MariaHarness(server, db)
    rows(h, "ra", 1, 30, "a")
    rows(h, "rs", 1, 10, "s")
    rows(h, "rs_new", 100, 120, "n")
    rows(h, "rd", 1, 5, "d")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 8") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": [f"{db}\\.r.*"]})
        cap.wait_notification("COMPLETED")
        mark = cap.end()
        h.execute("ALTER TABLE ra RENAME TO rb")
        h.execute("UPDATE rb SET v = 'after' WHERE id = 3")
        h.execute(f"RENAME TABLE rs TO rs_old, rs_new TO {db}.rs")
        h.execute("DROP TABLE rd")
        cap.wait_notification("TABLE_SCAN_COMPLETED", count=3, after=mark, timeout=60)
        events = cap.assert_oracle({"rb": ["id"], "rs": ["id"], "rs_old": ["id"]})
    got = materialize(events)
    assert not got.get(f"{db}.ra") and not got.get(f"{db}.rs_new") and not got.get(f"{db}.rd")
    truncated = sorted(e["source"]["table"] for e in events if e["op"] == "t")
    # rs twice: its relation left (renamed to rs_old), then rs_new took the name
    assert truncated == ["ra", "rb", "rd", "rs", "rs", "rs_new", "rs_old"], truncated


def test_rename_column_names_no_table() -> None:
    for q in ("ALTER TABLE t RENAME COLUMN a TO b", "alter table t rename index a to b",
              "ALTER TABLE t RENAME KEY a TO b"):
        ddl = parse_ddl(q, "db")
        assert ddl is not None and ddl.tables == (("db", "t"),), q
    ddl = parse_ddl("ALTER TABLE t RENAME TO `column`", "db")
    assert ddl is not None and ddl.tables == (("db", "t"), ("db", "column"))


@pytest.mark.parametrize("server", ["mariadb"], indirect=True)
def test_ddl_that_is_no_drop_or_rename(server: TestServer, db: str, tmp_path: Path) -> None:
    """None of these is a drop or a rename, so none truncates a table:
    - a string literal holding "rename x" (ALTER TABLE ... COMMENT) is no rename;
    - the server's own ``DROP /*!40005 TEMPORARY */ TABLE IF EXISTS`` of a session's
      temporary table shadowing a captured one (statement format, at its disconnect);
    - DROP TABLE IF EXISTS of a missing table, a table created and dropped without a row:
      no truncate of a table without recorded schema (the Delta sink cannot apply one).
    And MariaDB's CREATE OR REPLACE TABLE of a captured table empties it: truncated and
    snapshotted again."""
    h = MariaHarness(server, db)
    rows(h, "orders", 1, 20, "v")
    rows(h, "cor", 1, 10, "c")
    with Capture(h, tmp_path, "") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": [f"{db}\\.(orders|cor)"]})
        cap.wait_notification("COMPLETED")
        mark = cap.end()
        h.execute("ALTER TABLE orders COMMENT 'rename me later'",
                  "ALTER TABLE orders ALTER COLUMN v SET DEFAULT 'please rename this'")
        conn = server.connect(db)
        conn.autocommit(True)
        with conn.cursor() as cur:
            cur.execute("SET SESSION binlog_format = 'STATEMENT'")
            cur.execute("CREATE TEMPORARY TABLE orders (id INT PRIMARY KEY, v VARCHAR(40))")
            cur.execute("INSERT INTO orders VALUES (1, 'temp')")
        conn.close()
        time.sleep(1)  # the server logs the temporary table's drop at the disconnect
        h.execute("DROP TABLE IF EXISTS nothere",
                  "CREATE TABLE staging (id INT PRIMARY KEY)", "DROP TABLE staging",
                  "CREATE OR REPLACE TABLE cor (id INT PRIMARY KEY, v VARCHAR(40))",
                  "INSERT INTO cor VALUES (5, 'new')",
                  "INSERT INTO orders VALUES (99, 'marker')")
        cap.wait_notification("TABLE_SCAN_COMPLETED", after=mark, timeout=60)
        events = cap.assert_oracle({"orders": ["id"], "cor": ["id"]})
    truncated = sorted(e["source"]["table"] for e in events if e["op"] == "t")
    assert truncated == ["cor"], truncated
    assert len(materialize(events)[f"{db}.orders"]) == 21
