"""One row identity per table on every path (issue 12, item 3), against a real
PostgreSQL through `dblog run` and signals: stream events, snapshot rows and deletes
carry the same key, and the materialized log equals the table keyed by it."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness


def sid() -> str:
    return f"sig-{uuid.uuid4().hex[:8]}"


def churn(h: PgHarness, table: str, stop: threading.Event, seed: int, space: int) -> None:
    """Deletes, re-inserts and updates of random rows (by ``code``) until ``stop``."""
    rng = random.Random(seed)
    while not stop.is_set():
        i = rng.randrange(space)
        r = rng.random()
        if r < 0.4:
            h.execute(f"DELETE FROM {table} WHERE code = 'c{i}'")
        elif r < 0.7:
            h.execute(f"DELETE FROM {table} WHERE code = 'c{i}'",
                      f"INSERT INTO {table} (id, code, v) VALUES ({i}, 'c{i}', 'w{rng.random():.5f}')")
        else:
            h.execute(f"UPDATE {table} SET v = 'u{rng.random():.5f}' WHERE code = 'c{i}'")
        time.sleep(0.002)


def test_replica_identity_index_beside_primary_key(pg_db: str, tmp_path: Path) -> None:
    """PK ``id`` plus ``REPLICA IDENTITY USING INDEX`` on ``code``: deletes carry only
    ``code``, so ``code`` is the identity of stream *and* snapshot events (before: the
    snapshot keyed rows by ``id``, deletes came as ``{"id": null}``, rows deleted in a
    chunk's window were resurrected)."""
    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE ri (id int PRIMARY KEY, code text NOT NULL, v text)",
        "CREATE UNIQUE INDEX ri_code ON ri (code)",
        "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_code",
        "INSERT INTO ri SELECT g, 'c' || g, 'v' || g FROM generate_series(0, 399) g",
    )
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 7") as cap:
        stop = threading.Event()
        th = threading.Thread(target=churn, args=(h, "ri", stop, 3, 420))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.ri"]})
            cap.wait_notification("COMPLETED", timeout=180)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"ri": ["code"]})
    ri = [e for e in events if e["op"] != "n" and e["source"]["table"] == "ri"]
    assert ri and all(list(e["key"]) == ["code"] and e["key"]["code"] for e in ri)
    assert any(e["op"] == "d" for e in ri) and snapshot_rows(events, "ri")


def test_identity_index_without_primary_key_needs_no_surrogate_key(
    pg_db: str, tmp_path: Path
) -> None:
    """No PK, a two-column unique identity index: snapshotted by that index (before:
    rejected, "no primary key"), every event keyed by it."""
    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE nk (b int NOT NULL, a text NOT NULL, v text)",
        "CREATE UNIQUE INDEX nk_ab ON nk (a, b)",
        "ALTER TABLE nk REPLICA IDENTITY USING INDEX nk_ab",
        "INSERT INTO nk SELECT g % 13, 'a' || (g / 13), 'v' || g FROM generate_series(0, 299) g",
    )
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 10") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.nk"]})
        h.execute("DELETE FROM nk WHERE b = 3", "UPDATE nk SET v = 'x' WHERE b = 4")
        cap.wait_notification("COMPLETED", timeout=120)
        assert not cap.notifications("REJECTED")
        events = cap.assert_oracle({"nk": ["b", "a"]})
    rows = snapshot_rows(events, "nk")
    assert rows and all(sorted(e["key"]) == ["a", "b"] for e in rows)
    deletes = [e for e in events if e["op"] == "d" and e["source"]["table"] == "nk"]
    assert deletes and all(e["key"]["a"] is not None for e in deletes)
