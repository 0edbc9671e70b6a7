"""Concurrent windows across tables (``[snapshot] parallelism = 4``, ``core.flight``):
once a table has no chunk left to start, the next table's chunks are read beside its
tail, each table with its own windows. Many small tables under a write load, then the
oracle (materialize the change log, compare every column), each table's notifications
in order; and (slow) kill -9s while several tables are in flight.

PostgreSQL and MySQL/MariaDB readers fork (one connection per chunk in flight); on a
source whose reader cannot fork the same scenarios would run one chunk at a time and
must give the same change log contents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chaos import Load, kill_and_restart, kill_seed, reporting, writing
from tests.contract.capture import Capture, Event, snapshot_rows
from tests.contract.harness import Harness, source_name
from tests.contract.test_snapshots import q, writer
from tests.helpers import sid

TABLES = [f"pt{i}" for i in range(8)]
ROWS = 1500
BIG = 15_000  # the kill -9 scenario: ~120k rows, a few seconds of snapshot


def _tables(h: Harness, rows: int = ROWS) -> None:
    for n, name in enumerate(TABLES):  # different sizes: tails end at different times
        h.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
        for lo in range(0, rows - 100 * n, 5000):
            hi = min(lo + 5000, rows - 100 * n)
            values = ", ".join(f"({i}, 'v{i}', {i % 7})" for i in range(lo, hi))
            h.execute(f"INSERT INTO {name} (id, v, n) VALUES {values}")


def _table_of(e: Event) -> str:
    return str(e["table"] if "table" in e else e["source"]["table"])


def assert_notifications_in_order(events: list[Event], tables: list[str]) -> None:
    """Per table: TABLE_SCAN_STARTED, IN_PROGRESS..., TABLE_SCAN_COMPLETED, each once per
    scan; COMPLETED once, after every table's TABLE_SCAN_COMPLETED."""
    notes = [e for e in events if e["op"] == "n"]
    seen: dict[str, list[str]] = {t: [] for t in tables}
    for e in notes:
        typ = e["notification"]["type"]
        if typ in ("TABLE_SCAN_STARTED", "IN_PROGRESS", "TABLE_SCAN_COMPLETED"):
            seen[_table_of(e)].append(typ)
    for table, types in seen.items():
        assert types and types[0] == "TABLE_SCAN_STARTED", (table, types[:3])
        assert types[-1] == "TABLE_SCAN_COMPLETED", (table, types[-3:])
        assert types.count("TABLE_SCAN_STARTED") == types.count("TABLE_SCAN_COMPLETED") == 1
    kinds = [e["notification"]["type"] for e in notes]
    assert kinds.count("COMPLETED") == 1
    assert kinds.index("COMPLETED") > max(
        i for i, k in enumerate(kinds) if k == "TABLE_SCAN_COMPLETED"
    )


def _writers(h: Harness) -> list[Load]:
    """Writes to three of the tables (seeds 0, 1, 2), as loads for ``writing``."""
    def load(name: str, seed: int) -> Load:
        return lambda stop: writer(h, name, stop, seed, ROWS + 200)

    return [load(name, seed) for seed, name in enumerate((TABLES[1], TABLES[4], TABLES[7]))]


def _expected(h: Harness) -> dict[str, list[str]]:
    return {name: ["id"] for name in TABLES}


def test_many_tables_in_flight_with_writes(harness: Harness, tmp_path: Path) -> None:
    _tables(harness)
    settings = "[snapshot]\nchunk_size = 256\nparallelism = 4"
    with Capture(harness, tmp_path, settings) as cap:
        with writing(*_writers(harness)):
            harness.signal(sid(), "execute-snapshot", {"data-collections": [q(harness, "pt[0-9]")]})
            cap.wait_notification("COMPLETED", timeout=240)
        events = cap.assert_oracle(_expected(harness))
        err = cap.stop()
    assert_notifications_in_order(events, TABLES)
    for n, name in enumerate(TABLES):
        if name not in (TABLES[1], TABLES[4], TABLES[7]):  # no writes: every row read once
            assert len(snapshot_rows(events, name)) == ROWS - 100 * n, name
    assert "up to 4 read at once" in err  # both readers fork (PostgreSQL, MySQL/MariaDB)
    # Tables read beside each other, seen from the reader's side: a table's start was
    # handed to the readers while chunks of another were being read. (In the change log
    # the overlap depends on how the stream batches watermarks: under load a table's last
    # windows can all close in one pass, before the next table's first.)
    assert "started beside the last chunks of" in err, err[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_many_tables_in_flight_survive_kill9(
    harness: Harness, tmp_path: Path, watermark: str
) -> None:
    """kill -9 three times at random moments while several tables have windows open
    (under writes): each restart resumes every table in flight after its emitted
    prefix; the change log materializes to the tables and each table's notifications
    stay in order."""
    if watermark == "read-only" and source_name(harness) != "postgres":
        pytest.skip("the MySQL read-only scenarios are in test_read_only.py")
    _tables(harness, BIG)
    # Small chunks: the snapshot takes seconds (with 256-row chunks it ended before the
    # first kill), and many windows are in flight at every kill.
    settings = f'[snapshot]\nchunk_size = 64\nparallelism = 4\nwatermark = "{watermark}"'
    mid: list[bool] = []  # per kill: before the snapshot completed
    with Capture(harness, tmp_path, settings) as cap:
        with writing(*_writers(harness)):
            harness.signal(sid(), "execute-snapshot", {"data-collections": [q(harness, "pt[0-9]")]})

            def kill() -> None:
                mid.append(not cap.notifications("COMPLETED"))
                cap.kill()

            def tables_in_flight(n: int, rng: object) -> None:
                if n == 0:  # the first kill 0-0.4 s after the second table started
                    cap.wait_notification("TABLE_SCAN_STARTED", count=2, timeout=120)

            kills = kill_and_restart(kill, cap.start, 3, kill_seed(21 if watermark == "table" else 22),
                                     delay=(0.0, 0.4), each_round=tables_in_flight,
                                     note=lambda: f"mid-snapshot {mid[-1]}")
            with reporting(kills):
                cap.wait_notification("COMPLETED", timeout=300)
        with reporting(kills):
            events = cap.assert_oracle(_expected(harness))
        cap.stop()
    with reporting(kills):
        assert sum(mid) >= 2
        assert_notifications_in_order(events, TABLES)
        summary: dict[str, Any] = {
            name: len({e["key"]["id"] for e in snapshot_rows(events, name)}) for name in TABLES
        }
        for n, name in enumerate(TABLES):
            if name not in (TABLES[1], TABLES[4], TABLES[7]):
                assert summary[name] == BIG - 100 * n, summary
