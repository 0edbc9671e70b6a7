"""A table dropped and created again under the same name (issue 12, the hunt), against a
real PostgreSQL through `dblog run`: the old table's rows must leave the materialized
log (a truncate in stream order, before the new table's first event), and the new
table's rows written before it joined the publication must arrive (its snapshot starts
over, bounded by the new table's keys). Also a table dropped for good: its rows leave.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.helpers import materialize, sid, source_rows


def create(h: PgHarness, name: str, first: int, last: int, tag: str) -> None:
    h.execute(
        f"CREATE TABLE {name} (id int PRIMARY KEY, v text)",
        f"INSERT INTO {name} SELECT g, '{tag}' || g FROM generate_series({first}, {last}) g",
    )


def test_table_recreated_after_its_snapshot(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    create(h, "rc", 1, 30, "old")
    create(h, "gone", 1, 5, "g")
    with Capture(h, tmp_path, '[snapshot]\nmode = "initial"\nchunk_size = 8') as cap:
        cap.wait_notification("COMPLETED")
        # Dropped and created again in one transaction, rows written at once: before
        # any heartbeat can add the new table to the publication.
        h.execute("DROP TABLE rc", "DROP TABLE gone")
        create(h, "rc", 20, 45, "new")
        h.execute("UPDATE rc SET v = 'x' WHERE id = 21")
        cap.wait_until(rescanned, what="a truncate, then a completed scan")
        h.execute("UPDATE rc SET v = 'y' WHERE id = 22", "DELETE FROM rc WHERE id = 23")
        events = cap.assert_oracle({"rc": ["id"]})
    got = materialize(events)
    assert not got.get("public.gone")
    truncates = [e for e in events if e["op"] == "t"]
    assert {e["source"]["table"] for e in truncates} == {"rc", "gone"}


def rescanned(events: list[dict[str, Any]]) -> bool:
    """A truncate was logged, and a table scan completed after it."""
    truncates = [e["offset"] for e in events if e["op"] == "t"]
    return bool(truncates) and any(
        e["op"] == "n" and e["notification"]["type"] == "TABLE_SCAN_COMPLETED"
        and e["offset"] > truncates[-1]
        for e in events
    )


def test_table_recreated_during_its_snapshot(pg_db: str, tmp_path: Path) -> None:
    """Recreated while its snapshot is in progress: the progress (max key 2000, last key)
    described the old table; the snapshot starts over on the new one, whose keys go up
    to 3000, while it is written to."""
    h = PgHarness(pg_db)
    create(h, "rs", 1, 2000, "old")
    extra = "[snapshot]\nchunk_size = 40\nadaptive = false"
    with Capture(h, tmp_path, extra) as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.rs"]})
        cap.wait_notification("IN_PROGRESS", count=5)
        h.execute("DROP TABLE rs")
        create(h, "rs", 1000, 3000, "new")
        stop = threading.Event()

        def write() -> None:
            with psycopg.connect(h.dsn, autocommit=True) as conn:
                n = 0
                while not stop.is_set():
                    n += 1
                    conn.execute("UPDATE rs SET v = v || '+' WHERE id = %s", (1000 + (n * 37) % 2000,))
                    time.sleep(0.002)

        th = threading.Thread(target=write)
        th.start()
        try:
            cap.wait_until(rescanned, timeout=180, what="a truncate, then a completed scan")
        finally:
            stop.set()
            th.join()
        # The drop may have been noticed before the re-creation (a truncate, the table
        # gone), the re-creation at a later heartbeat (another truncate, a rescan).
        want = source_rows(h.dsn, "public.rs", ["id"])
        cap.wait_until(lambda ev: materialize(ev).get("public.rs") == want and rescanned(ev),
                       timeout=180, what="the re-created table's rows")
        events = cap.assert_oracle({"rs": ["id"]})
    assert max(e["key"]["id"] for e in snapshot_rows(events, "rs")) == 3000


def test_table_dropped_while_the_publication_is_refreshed(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A captured table dropped between the refresh's listing of the tables and its
    ALTER PUBLICATION (the interleaving forced here; it happened under load in
    test_table_recreated_during_its_snapshot): the refresh took the listed table for a
    re-created one and the ALTER failed with 'relation does not exist', a fatal error
    that ended `dblog run` (its new relation was then never snapshotted). Now the
    refresh lists again: the table is gone (one truncate), nothing fails."""
    from pydblog.config import parse_config
    from pydblog.ports import RelationReset, ResetKind
    from pydblog.sources.postgres import setup
    from pydblog.sources.postgres.source import PgLogSource

    h = PgHarness(pg_db)
    create(h, "rd", 1, 3, "old")
    cfg = parse_config({"source": {"dsn": pg_db, "tables": ["public\\.(rd|dblog_test_marker)"],
                                   "heartbeat_interval_s": 3600}})
    source = PgLogSource(cfg)
    source.open(None)
    try:
        listed = setup.list_tables
        dropped: list[bool] = []

        def list_then_drop(*args: Any, **kwargs: Any) -> list[setup.CapturedTable]:
            tables = listed(*args, **kwargs)
            if not dropped:  # the DROP commits right after the listing
                dropped.append(True)
                with psycopg.connect(pg_db, autocommit=True) as conn:
                    conn.execute("DROP TABLE rd")
            return tables

        monkeypatch.setattr(setup, "list_tables", list_then_drop)
        source.refresh_tables()
        assert dropped
        assert source.captured_tables == ["public.dblog_test_marker"]
        h.execute("INSERT INTO dblog_test_marker VALUES ('end')")
        resets = []
        for item in source.stream():
            if isinstance(item, RelationReset):
                resets.append(item.kind)
            elif getattr(item, "table", None) == "dblog_test_marker":
                break
        assert resets == [ResetKind.GONE]
    finally:
        source.close()


def test_table_recreated_while_capture_was_down(pg_db: str, tmp_path: Path) -> None:
    """Dropped and created again while `dblog run` was down (or before the heartbeat
    that would have noticed it, when it was killed): at start the table is found
    outside the publication. The log holds the old relation's rows, so its truncate is
    logged, and the new relation's rows, written before it joined the publication, are
    in no event: it must be snapshotted also without mode = "initial" (it was only
    truncated, and the materialized log stayed empty while the source had rows)."""
    h = PgHarness(pg_db)
    create(h, "rw", 1, 30, "old")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 8") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.rw"]})
        cap.wait_notification("COMPLETED")
        cap.kill()
        h.execute("DROP TABLE rw")
        create(h, "rw", 20, 45, "new")
        cap.start()
        cap.wait_until(rescanned, what="a truncate, then a completed scan")
        h.execute("UPDATE rw SET v = 'y' WHERE id = 22")
        cap.assert_oracle({"rw": ["id"]})
