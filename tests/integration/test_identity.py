"""One row identity per table on every path, against a real
PostgreSQL through `dblog run` and signals: stream events, snapshot rows and deletes
carry the same key, and the materialized log equals the table keyed by it."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.helpers import sid


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


def test_float_key_has_one_canonical_text_on_both_paths(pg_db: str, tmp_path: Path) -> None:
    """A float primary key's event key is the same text in snapshot rows and stream
    events (PostgreSQL writes 1e+16 where orjson writes 1e16: consumers comparing key
    texts, e.g. by Kafka message key, saw two keys for one row)."""
    import re

    from pydblog.changelog.sqlite import SqliteChangeLogReader

    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE fk (k float8 PRIMARY KEY, v int)",
        "INSERT INTO fk VALUES (1e16, 1), (1.5e-7, 2), (0.1, 3), (123456789012.5, 4), (-2e300, 5)",
    )
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 2") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.fk"]})
        cap.wait_notification("COMPLETED")
        h.execute("UPDATE fk SET v = v + 10")
        cap.assert_oracle({"fk": ["k"]})
        reader = SqliteChangeLogReader(cap.log_dir)
        texts: dict[str, set[str]] = {"r": set(), "u": set()}
        for rec in reader.read(0, 10**6, tables=["public.fk"]):
            m = re.search(rb'"key":(\{[^}]*\})', rec.body)
            if rec.op in texts and m is not None:
                texts[rec.op].add(m.group(1).decode())
        reader.close()
    assert len(texts["r"]) == 5 and texts["r"] == texts["u"], texts


def test_array_and_numeric_keys_across_chunk_boundaries(pg_db: str, tmp_path: Path) -> None:
    """Chunks resume after the previous chunk's last key, given back to PostgreSQL as a
    literal: an array key (``[1, 2]`` is not an array literal) and text arrays with
    quotes, NULL elements and nesting must round-trip, as must numeric keys of several
    scales."""
    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE ak (k int[] PRIMARY KEY, v text)",
        "INSERT INTO ak SELECT ARRAY[g, g * 2], 'v' || g FROM generate_series(1, 9) g",
        "INSERT INTO ak VALUES ('{}', 'empty'), (ARRAY[NULL, 1]::int[], 'null elem'),"
        " ('{{1,2},{3,4}}', 'nested')",
        "CREATE TABLE tk (k text[] PRIMARY KEY)",
        """INSERT INTO tk VALUES ('{a,b}'), ('{"x,y","q\\"z"}'), ('{"NULL",c}'), ('{d}'), ('{e}')""",
        "CREATE TABLE nk (k numeric PRIMARY KEY, v int)",
        "INSERT INTO nk VALUES (1, 1), (1.50, 2), (2.000, 3), (-0.001, 4), (1e20, 5), (3.1, 6)",
    )
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 2\nadaptive = false") as cap:
        h.signal(sid(), "execute-snapshot",
                 {"data-collections": ["public\\.ak", "public\\.tk", "public\\.nk"]})
        cap.wait_notification("COMPLETED", timeout=120)
        assert not cap.notifications("REJECTED")
        events = cap.assert_oracle({"ak": ["k"], "tk": ["k"], "nk": ["k"]})
    assert len(snapshot_rows(events, "ak")) == 12 and len(snapshot_rows(events, "tk")) == 5
    assert len(snapshot_rows(events, "nk")) == 6


def test_snapshot_only_table_gets_its_schema_recorded(pg_db: str, tmp_path: Path) -> None:
    """A table whose first events are snapshot rows (no stream event of it yet) gets its
    schema recorded in the change log before its rows, as the stream would describe it
    (types, nullability, identity): the sinks used to infer types from values (numeric
    and timestamps as text) and made a whole-row identity NOT NULL."""
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE so (id int PRIMARY KEY, n numeric(10,2), ts timestamptz, ok bool, t text)",
        "INSERT INTO so VALUES (1, 1.50, now(), true, 'a'), (2, NULL, NULL, NULL, NULL)",
    )
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 10") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.so"]})
        cap.wait_notification("COMPLETED")
        cap.caught_up()
        reader = SqliteChangeLogReader(cap.log_dir)
        before = [(o, s) for o, s in reader.schemas() if s.table == "so"]
        h.execute("UPDATE so SET t = 'b' WHERE id = 1")  # the stream's own description
        cap.caught_up()
        after = [(o, s) for o, s in reader.schemas() if s.table == "so"]
        first_row = min(e["offset"] for e in snapshot_rows(cap.events(), "so"))
        reader.close()
    assert len(before) == 1 and before[0][0] <= first_row
    schema = before[0][1]
    assert schema.key == ("id",)
    assert [(c.name, c.type, c.nullable) for c in schema.columns] == [
        ("id", "integer", False), ("n", "numeric(10,2)", True),
        ("ts", "timestamp with time zone", True), ("ok", "boolean", True), ("t", "text", True),
    ]
    assert [s for _, s in after] == [schema]  # the stream described it the same way
