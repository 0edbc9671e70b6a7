"""Unchanged TOAST never loses a value (issue 12, item 1), against a real PostgreSQL
through `dblog run`: materializing the log (keeping the previous value of every
``unchanged`` column) gives the table byte for byte, the TOASTed column included, when
the only event of a key carries the placeholder: a partial UPDATE inside a chunk's
window (which drops the chunk row), and a key-changing UPDATE (whose create no consumer
has seen). The capture repairs both by key-level re-reads through the window."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.events import UNCHANGED_TOAST
from tests.contract.capture import Capture
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


@pytest.mark.parametrize("watermark", WATERMARKS)
def test_partial_updates_inside_chunk_windows(pg_db: str, tmp_path: Path, watermark: str) -> None:
    """Partial UPDATEs (``big`` untouched) while the table is snapshotted in small
    chunks: every chunk row they drop must be re-read, or the key's only events carry the
    placeholder."""
    h = PgHarness(pg_db)
    big_table(h, "pw", 300)
    extra = f'[snapshot]\nchunk_size = 5\nadaptive = false\nwatermark = "{watermark}"'
    with Capture(h, tmp_path, extra) as cap:
        stop = threading.Event()
        th = threading.Thread(target=partial_updates, args=(h, "pw", stop, 300))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.pw"]})
            cap.wait_notification("COMPLETED", timeout=180)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"pw": ["id"]})
    ids = [e["key"]["id"] for e in events if e["op"] == "r" and e["source"]["table"] == "pw"]
    assert len(ids) >= 300
    if watermark == "read-only":
        assert watermark_writes(h) == 0
    # Some rows were dropped from their chunk and re-read (read after a later chunk's
    # rows) in most runs; in a run where timing put no partial update inside a window the
    # oracle above still held, but the re-read path was not exercised: say so.
    if ids == sorted(ids):
        pytest.skip("no partial update landed inside a chunk window this run (timing)")


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
