"""Unchanged TOAST never loses a value, against a real PostgreSQL
through `dblog run`: materializing the log (keeping the previous value of every
``unchanged`` column) gives the table byte for byte, the TOASTed column included, when
the only event of a key carries the placeholder: a partial UPDATE inside a chunk's
window (which drops the chunk row), and a key-changing UPDATE (whose create no consumer
has seen). The capture repairs both by key-level re-reads through the window."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.events import UNCHANGED_TOAST
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.helpers import materialize, sid

BIG = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 400) g)"
"""~12.8 kB of hex: stored out of line (TOASTed) even after compression."""


def big_table(h: PgHarness, name: str, rows: int) -> None:
    h.execute(
        f"CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL DEFAULT 0, big text)",
        f"ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL",  # out of line, uncompressed
        f"INSERT INTO {name} (id, big) SELECT i, {BIG} || i FROM generate_series(1, {rows}) i",
    )


def toasted(h: PgHarness, name: str) -> int:
    """How many rows hold ``big`` out of line (the test is only meaningful if most do)."""
    with psycopg.connect(h.dsn) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {name} WHERE pg_column_size(big) > 2000"
        ).fetchone()
        assert row is not None
        return int(row[0])


WATERMARKS = ["table", "read-only"]
"""Key re-reads go through the window of each: watermarks, or the read's own fence."""


def watermark_writes(h: PgHarness) -> int:
    with psycopg.connect(h.dsn) as conn:
        if conn.execute("SELECT to_regclass('dblog_watermark')").fetchone() == (None,):
            return 0  # read-only captures create no watermark table
        row = conn.execute("SELECT count(*) FROM dblog_watermark WHERE value <> ''").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("watermark", WATERMARKS)
def test_key_change_create_gets_the_full_row(pg_db: str, tmp_path: Path, watermark: str) -> None:
    """UPDATE of the primary key with the TOASTed column untouched: the create of the new
    key carries the placeholder; a key re-read must deliver the value."""
    h = PgHarness(pg_db)
    big_table(h, "kc", 20)
    assert toasted(h, "kc") == 20
    extra = f'[snapshot]\nmode = "initial"\nchunk_size = 8\nwatermark = "{watermark}"'
    with Capture(h, tmp_path, extra) as cap:
        cap.wait_notification("COMPLETED")
        h.execute("UPDATE kc SET id = id + 1000, n = 1 WHERE id <= 5")
        h.execute("UPDATE kc SET id = 2000 WHERE id = 1001", "UPDATE kc SET n = 2 WHERE id = 2000")
        # The key re-reads land asynchronously (read-only: once the stream passes their
        # fence), possibly after the oracle's marker: wait for them first.
        def re_read(ev: list[dict[str, Any]]) -> bool:
            rows = materialize(ev).get("public.kc", {})
            return (rows.get((2000,)) or {}).get("n") == 2 and all(
                r.get("big") != UNCHANGED_TOAST for r in rows.values())

        cap.wait_until(re_read, what="the key re-reads")
        events = cap.assert_oracle({"kc": ["id"]})
    creates = [e for e in events if e["op"] == "c" and e["source"]["table"] == "kc"]
    assert creates and all(e.get("unchanged") == ["big"] for e in creates)
    if watermark == "read-only":
        assert watermark_writes(h) == 0


def partial_updates(h: PgHarness, name: str, stop: threading.Event, rows: int) -> None:
    rng = random.Random(5)
    with psycopg.connect(h.dsn, autocommit=True) as conn:
        while not stop.is_set():
            # 20 neighbours at a time: a read-only chunk's window (its snapshot .. the
            # stream passing its fence) is short, single-row updates rarely hit it.
            low = rng.randrange(1, rows + 1)
            conn.execute(f"UPDATE {name} SET n = n + 1 WHERE id BETWEEN %s AND %s", (low, low + 19))
            time.sleep(0.001)


_CHUNK_RANGE = re.compile(r"WHERE (?:\(\"id\"\) > \('(\d+)'::\w+\)|true) AND \(\"id\"\) <= \('(\d+)'")
"""A chunk read's key range in its query text: ``WHERE ("id") > ('25'::integer) AND
("id") <= ('30'::integer)`` (after, upper bound), ``WHERE true AND ...`` for the first."""

GATE = 7_140_715
"""The advisory lock the chunk reads of ``test_partial_updates_inside_chunk_windows``
take (shared, through the snapshot's filter) and the test holds to stop them."""


def _waiting_chunk_reads(conn: psycopg.Connection[Any], seen: set[str] | None = None) -> list[str]:
    """The queries of sessions waiting for the ``GATE`` that are chunk reads of the
    capture: not its boundary (``OFFSET``) or max-key (``DESC``) queries (every query
    waiting for it is added to ``seen``)."""
    rows = conn.execute(
        "SELECT a.query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND l.locktype = 'advisory' AND l.objid = %s",
        (GATE,),
    ).fetchall()
    if seen is not None:
        seen.update(q for (q,) in rows)
    return [q for (q,) in rows
            if "OFFSET" not in q and " DESC" not in q and _CHUNK_RANGE.search(q)]


def update_inside_a_chunk_window(
    cap: Capture, h: PgHarness, table: str, chunk: int, start: Callable[[], None]
) -> set[int]:
    """Forces what timing gave only sometimes: a partial UPDATE (``big`` untouched) of
    every row, committed and logged while a chunk read is in progress (so inside its
    window), before the read returns.

    The snapshot's filter takes the shared advisory lock ``GATE`` in each chunk read's
    transaction, after its snapshot (and, with watermarks, its low watermark); the test
    holds the lock exclusively. Once a chunk read waits for it, the update commits, and
    once the capture has logged the update's events the lock is let go. The read's rows
    are from before the update (its snapshot is older) and the update's events come
    before the read's answer, so every row of the chunk is dropped, and only a key
    re-read (no filter) can give the rows' ``big``. (A boundary or max-key query may be
    the one waiting: then the lock is let go and taken again.) ``start`` (the snapshot
    signal) runs once the lock is first held: on a quiet machine the whole snapshot took
    less than a poll of the log, and no read was left to stop. Returns the keys of the
    chunk(s) that waited."""
    deadline = time.monotonic() + 90
    seen: set[str] = set()
    started: list[bool] = []
    with psycopg.connect(h.dsn, autocommit=True) as watch:
        while time.monotonic() < deadline:
            with psycopg.connect(h.dsn, autocommit=True) as gate:
                gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
                if not started:
                    started.append(True)
                    start()
                wait_until = time.monotonic() + 3
                while time.monotonic() < wait_until:
                    others = len(seen)
                    waiting = _waiting_chunk_reads(watch, seen)
                    if waiting:
                        break
                    if len(seen) > others:  # a boundary or max-key query: let it pass
                        wait_until = min(wait_until, time.monotonic() + 0.3)
                    time.sleep(0.02)
                else:
                    continue  # (closing the connection lets the lock go)
                keys: set[int] = set()
                for q in waiting:
                    m = _CHUNK_RANGE.search(q)
                    assert m is not None
                    after, upper = int(m.group(1) or 0), int(m.group(2))
                    keys |= set(range(after + 1, min(after + chunk, upper) + 1))
                watch.execute(f"UPDATE {table} SET n = n + 1")

                def logged(ev: list[dict[str, Any]], keys: set[int] = keys) -> bool:
                    done = {e["key"]["id"] for e in ev if e["op"] == "u" and e["source"]["table"] == table}
                    return keys <= done

                cap.wait_until(logged, what="the update's events")
                assert _waiting_chunk_reads(watch), "the chunk read stopped waiting"
                return keys
    raise AssertionError(
        f"no chunk read of {table} waited for the gate within 90 s; the queries that did "
        f"(a chunk read must match _CHUNK_RANGE): {sorted(seen)[:5]}")


@pytest.mark.parametrize("watermark", WATERMARKS)
def test_partial_updates_inside_chunk_windows(pg_db: str, tmp_path: Path, watermark: str) -> None:
    """A partial UPDATE (``big`` untouched) inside a chunk's window, forced
    (``update_inside_a_chunk_window``): it drops the chunk's rows, whose keys' only
    events then carry the placeholder, so each must be re-read (after the update: with
    the updated ``n``), and materializing the log gives the table, ``big`` included."""
    h = PgHarness(pg_db)
    big_table(h, "pw", 300)
    extra = f'[snapshot]\nchunk_size = 5\nadaptive = false\nwatermark = "{watermark}"'
    with Capture(h, tmp_path, extra) as cap:
        held = update_inside_a_chunk_window(cap, h, "pw", 5, lambda: h.signal(sid(), "execute-snapshot", {
            "data-collections": ["public\\.pw"],
            "additional-conditions": [{"data-collection": "public.pw",
                                       "filter": f"pg_advisory_xact_lock_shared({GATE}) IS NOT NULL"}],
        }))
        cap.wait_notification("COMPLETED", timeout=180)
        events = cap.assert_oracle({"pw": ["id"]})
    assert held
    for key in held:
        reads = [e["after"] for e in snapshot_rows(events, "pw") if e["key"]["id"] == key]
        updates = [e for e in events if e["op"] == "u" and e["key"]["id"] == key]
        # The waiting read saw n = 0; its rows were dropped: only the re-read's (n = 1).
        assert reads and all(r["n"] == 1 for r in reads), (key, reads)
        assert updates and all(e.get("unchanged") == ["big"] for e in updates), (key, updates)
    if watermark == "read-only":
        assert watermark_writes(h) == 0


@pytest.mark.slow
def test_partial_updates_with_kill9_mid_snapshot(pg_db: str, tmp_path: Path) -> None:
    """The same under kill -9s in the middle of the snapshot: pending key re-reads are
    part of the persisted snapshot state, so a restart still repairs every dropped
    row."""
    h = PgHarness(pg_db)
    big_table(h, "pk", 400)
    cap = Capture(h, tmp_path, "[snapshot]\nchunk_size = 5\nadaptive = false").start()
    stop = threading.Event()
    th = threading.Thread(target=partial_updates, args=(h, "pk", stop, 400))
    th.start()
    try:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.pk"]})
        for n in (60, 200):

            def enough(ev: list[dict[str, Any]], n: int = n) -> bool:
                return sum(1 for e in ev if e["op"] == "r") >= n

            cap.wait_until(enough, what=f"{n} snapshot rows")
            cap.kill()
            cap.start()
        cap.wait_notification("COMPLETED", timeout=300)
    finally:
        stop.set()
        th.join()
    try:
        cap.assert_oracle({"pk": ["id"]})
    finally:
        cap.stop()
