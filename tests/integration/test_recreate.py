"""A table dropped and created again under the same name, against a
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
from tests.helpers import each_event, materialize, sid, source_rows, write_config


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
        for item in each_event(source.stream()):
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


def test_table_with_no_rows_logged_recreated_while_capture_was_down(
    pg_db: str, tmp_path: Path
) -> None:
    """Captured, but empty (no row of it in the log), then dropped and created again
    with rows while `dblog run` was down: at start the table is found outside the
    publication, and nothing in the change log tells it from a table created for the
    first time. It was captured before (the capture remembers which tables it captured,
    in its checkpoint), so the new relation's rows, written before it joined the
    publication and so in no event, must be snapshotted also without mode = "initial"."""
    h = PgHarness(pg_db)
    h.execute("CREATE TABLE re (id int PRIMARY KEY, v text)")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 8") as cap:
        cap.caught_up()
        cap.kill()
        h.execute("DROP TABLE re")
        create(h, "re", 1, 20, "new")
        cap.start()
        cap.wait_until(rescanned, what="a truncate, then a completed scan")
        h.execute("UPDATE re SET v = 'y' WHERE id = 2")
        cap.assert_oracle({"re": ["id"]})


def test_publication_refresh_that_keeps_failing(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Captured tables dropped between the listing and the ALTER PUBLICATION in every
    one of the refresh's attempts (forced: the listing always names a dropped table).
    At a heartbeat that refresh raised TableDropped out of the capture loop: `dblog run`
    tore the capture down and restarted it, and the restart (a fresh source, nothing
    captured yet) never logged the truncate of a table dropped meanwhile, whose rows
    then stayed in every mirror. Now a heartbeat's refresh that keeps failing changes
    nothing (its transaction rolled back), says so, and the next heartbeat tries again;
    at start it is an error that names the cause."""
    from pydblog.config import parse_config
    from pydblog.errors import SourceError
    from pydblog.ports import RelationReset, ResetKind
    from pydblog.sources.postgres import setup
    from pydblog.sources.postgres.source import PgLogSource

    h = PgHarness(pg_db)
    create(h, "rk", 1, 3, "k")
    create(h, "rg", 1, 3, "g")
    cfg = parse_config({"source": {"dsn": pg_db, "tables": ["public\\.(rk|rg|dblog_test_marker)"],
                                   "heartbeat_interval_s": 3600}})
    listed = setup.list_tables

    def with_a_dropped_table(*args: Any, **kwargs: Any) -> list[setup.CapturedTable]:
        return [*listed(*args, **kwargs), setup.CapturedTable("public", "rz_dropped", True, "d")]

    source = PgLogSource(cfg)
    source.open(None)
    try:
        before = source.captured_tables
        h.execute("DROP TABLE rg")
        monkeypatch.setattr(setup, "list_tables", with_a_dropped_table)
        source.refresh_tables()  # a heartbeat's: no exception
        assert source.captured_tables == before
        assert "the publication was not refreshed" in caplog.text
        monkeypatch.setattr(setup, "list_tables", listed)
        source.refresh_tables()  # the next heartbeat's
        assert "public.rg" not in source.captured_tables
        h.execute("INSERT INTO dblog_test_marker VALUES ('end')")
        resets = []
        for item in each_event(source.stream()):
            if isinstance(item, RelationReset):
                resets.append((item.event.table, item.kind))
            elif getattr(item, "table", None) == "dblog_test_marker":
                break
        assert resets == [("rg", ResetKind.GONE)]
    finally:
        source.close()
    monkeypatch.setattr(setup, "list_tables", with_a_dropped_table)
    again = PgLogSource(cfg)
    with pytest.raises(SourceError, match="kept being dropped") as err:
        again.open(None)
    again.close()
    assert "rz_dropped" in str(err.value)


def test_table_dropped_while_capture_was_down(pg_db: str, tmp_path: Path) -> None:
    """Dropped for good while `dblog run` was down (or before the heartbeat that would
    have noticed it, when it was killed): nothing in the new relation list names it,
    but the checkpoint lists the tables captured, so at start its truncate is logged
    and its rows leave the materialized log (they stayed there for good). A captured
    table that still exists but that the configuration no longer matches is not
    truncated: it is no longer captured, its rows were not deleted."""
    h = PgHarness(pg_db)
    create(h, "rx", 1, 10, "x")
    create(h, "ry", 1, 5, "y")
    create(h, "rkeep", 1, 5, "k")
    with Capture(h, tmp_path, "[snapshot]\nmode = \"initial\"\nchunk_size = 8") as cap:
        cap.wait_notification("COMPLETED")
        cap.caught_up()
        cap.kill()
        h.execute("DROP TABLE rx", "DROP TABLE ry")
        create(h, "ry", 3, 4, "again")  # dropped and created again: truncate, rescan
        cap.config.write_text(cap.config.read_text().replace(
            "[source]", '[source]\ntables = ["public\\\\.(rx|ry|dblog_test_marker)"]'))
        cap.start()
        cap.wait_until(rescanned, what="a truncate, then a completed scan")
        events = cap.assert_oracle({"ry": ["id"]})
    got = materialize(events)
    assert not got.get("public.rx")
    assert len(got.get("public.rkeep", {})) == 5
    truncated = {e["source"]["table"] for e in events if e["op"] == "t"}
    assert truncated == {"rx", "ry"}


def test_table_recreated_in_a_for_all_tables_publication(pg_db: str, tmp_path: Path) -> None:
    """An administrator's FOR ALL TABLES publication (as a standby's capture with
    primary_dsn is told to use) never changes membership: the new relation is published
    the moment it is created. Its re-creation is still found (another relation under the
    captured name) and reset: the old relation's rows leave the log, the new one is
    snapshotted, and the log ends equal to the table. Renamed, it is a relation
    captured under another name: its rows leave the old name and are snapshotted under
    the new one."""
    h = PgHarness(pg_db)
    create(h, "ra", 1, 30, "old")
    h.execute("CREATE PUBLICATION dblog FOR ALL TABLES WITH (publish_via_partition_root = true)")
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 8") as cap:
        cap.caught_up()
        h.execute("UPDATE ra SET v = 'u' || id")  # the old rows, logged
        cap.caught_up()
        h.execute("DROP TABLE ra")
        create(h, "ra", 20, 45, "new")
        # (Noticed at one refresh: a truncate and a scan; or the drop first, then the
        # table back at a later one: a truncate each, and a scan.)
        want = source_rows(h.dsn, "public.ra", ["id"])
        cap.wait_until(lambda ev: materialize(ev).get("public.ra") == want and rescanned(ev),
                       what="the re-created table's rows, after a truncate and a scan")
        h.execute("UPDATE ra SET v = 'y' WHERE id = 22")
        cap.assert_oracle({"ra": ["id"]})
        # Renamed: its rows leave the old name and are snapshotted under the new one.
        mark = cap.end()
        h.execute("ALTER TABLE ra RENAME TO rb")
        want = source_rows(h.dsn, "public.rb", ["id"])
        cap.wait_until(lambda ev: materialize(ev).get("public.rb") == want
                       and rescanned([e for e in ev if e["offset"] >= mark]),
                       what="truncates, then a completed scan of rb")
        h.execute("UPDATE rb SET v = 'z' WHERE id = 23")
        events = cap.assert_oracle({"rb": ["id"]})
        assert not materialize(events).get("public.ra")


def test_table_newly_captured_at_a_restart_in_a_for_all_tables_publication(
    pg_db: str, tmp_path: Path
) -> None:
    """An existing table with rows that a restart captures for the first
    time (the `tables` setting widened; another one that gained a primary key while
    dblog was down) with mode = "initial": its rows are in no event, so it is reset
    (JOINED) and snapshotted, in a FOR ALL TABLES publication as in a FOR TABLE one
    (before: FOR ALL TABLES never produced a JOINED reset at start, and its existing
    rows never reached the log)."""
    h = PgHarness(pg_db)
    create(h, "pa", 1, 20, "a")
    create(h, "pb", 1, 30, "b")  # not captured by the first run's `tables`
    h.execute("CREATE TABLE pk (id int NOT NULL, v text)",  # no key: not capturable
              "INSERT INTO pk SELECT g, 'k' || g FROM generate_series(1, 12) g",
              "CREATE PUBLICATION dblog FOR ALL TABLES WITH (publish_via_partition_root = true)")
    extra = '[snapshot]\nmode = "initial"\nchunk_size = 8'
    marker = '"public\\\\.dblog_test_marker"'  # (caught_up's rows)
    cap = Capture(h, tmp_path, extra)
    write_config(tmp_path, h.dsn, extra=extra,
                 source_extra=f'tables = ["public\\\\.pa", "public\\\\.pk", {marker}]')
    with cap:
        cap.wait_notification("COMPLETED")
        h.execute("UPDATE pb SET v = 'b2' WHERE id = 3")  # not captured: not logged
        cap.caught_up()
        cap.stop()
        write_config(tmp_path, h.dsn, extra=extra,
                     source_extra=f'tables = ["public\\\\.p.", {marker}]')
        h.execute("UPDATE pb SET v = 'b3' WHERE id = 4",  # while down: in the stream
                  "ALTER TABLE pk ADD PRIMARY KEY (id)")
        mark = cap.end()
        cap.start()
        events = cap.wait_notification("COMPLETED", after=mark, signal_id="initial")
        h.execute("UPDATE pb SET v = 'b5' WHERE id = 5", "UPDATE pk SET v = 'k5' WHERE id = 5")
        events = cap.assert_oracle({"pa": ["id"], "pb": ["id"], "pk": ["id"]})
    scanned = {e["source"]["table"] for e in events if e["offset"] >= mark and e["op"] == "n"
               and e["notification"]["type"] == "TABLE_SCAN_COMPLETED"}
    assert scanned == {"pb", "pk"}
