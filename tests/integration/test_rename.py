"""A captured PostgreSQL table renamed (``ALTER TABLE … RENAME``): the relation stays in
dblog's publication under its new name, so its later changes are logged under that
name. The old name's rows must leave the materialized log (a truncate), and the new
name's must all be there: its rows from before the rename were logged under the old
name, so it is truncated and snapshotted (it kept only the changes made after the
rename: the rows it had were silently missing). A swap (two renames in one
transaction, a common way to replace a table) puts another relation under a captured
name: reset the same way."""

from __future__ import annotations

from pathlib import Path

from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.helpers import materialize, sid
from tests.integration.test_recreate import create


def test_renamed_table(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    create(h, "ra", 1, 30, "a")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 8") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.ra"]})
        cap.wait_notification("COMPLETED")
        mark = cap.end()
        h.execute("ALTER TABLE ra RENAME TO rb")
        h.execute("UPDATE rb SET v = 'after' WHERE id = 3")
        cap.wait_notification("TABLE_SCAN_COMPLETED", after=mark, timeout=60)
        h.execute("UPDATE rb SET v = 'later' WHERE id = 4")
        events = cap.assert_oracle({"rb": ["id"]})
    assert not materialize(events).get("public.ra")


def test_swapped_tables(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    create(h, "rs", 1, 20, "old")
    create(h, "rs_new", 100, 140, "new")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 8") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.rs.*"]})
        cap.wait_notification("COMPLETED")
        mark = cap.end()
        h.execute("ALTER TABLE rs RENAME TO rs_old", "ALTER TABLE rs_new RENAME TO rs")
        h.execute("UPDATE rs SET v = 'after' WHERE id = 101")
        cap.wait_notification("TABLE_SCAN_COMPLETED", count=2, after=mark, timeout=60)
        events = cap.assert_oracle({"rs": ["id"], "rs_old": ["id"]})
    assert not materialize(events).get("public.rs_new")


def test_table_renamed_while_capture_was_down(pg_db: str, tmp_path: Path) -> None:
    """Renamed while `dblog run` was down (kill -9): the checkpoint lists the captured
    tables, so at start the old name is gone and the new one, found in the publication
    under a name it was not captured under, is truncated and snapshotted."""
    h = PgHarness(pg_db)
    create(h, "rw", 1, 30, "w")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 8") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.rw"]})
        cap.wait_notification("COMPLETED")
        cap.caught_up()
        cap.kill()
        h.execute("ALTER TABLE rw RENAME TO rw2")
        mark = cap.end()
        cap.start()
        cap.wait_notification("TABLE_SCAN_COMPLETED", after=mark, timeout=60)
        events = cap.assert_oracle({"rw2": ["id"]})
    assert not materialize(events).get("public.rw")
