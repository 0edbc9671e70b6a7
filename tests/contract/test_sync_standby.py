"""Read-only snapshots on a primary whose commits wait for a synchronous standby.

PostgreSQL decodes a commit for the logical slot as soon as its record is flushed
locally; with ``synchronous_standby_names`` set, the committing transaction then waits
for the standby *while still shown as running*: other sessions (and so a chunk read on
the primary) do not see it yet, although the stream has delivered it. Checked on a
real primary with a real synchronous standby (``pg_basebackup -R``) that is shut down
while a transaction commits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.pgstandby import PgStandby
from tests.conftest import drop_database
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.contract.test_snapshots import make_table, q
from tests.helpers import sid


@pytest.fixture(scope="module")
def sync_primary() -> Iterator[tuple[PgCluster, PgStandby]]:
    """A primary with a synchronous standby. Sessions commit locally unless they ask
    for ``synchronous_commit = on`` (so the test's own signals never wait)."""
    primary = PgCluster(settings={"synchronous_commit": "local"}).start()
    standby = PgStandby(primary)
    try:
        standby.start()
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            # The standby by its name ('*' would let the capture's own logical
            # walsender acknowledge commits as a synchronous standby).
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'walreceiver'")
            conn.execute("SELECT pg_reload_conf()")
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()


@pytest.fixture
def sync_pg(sync_primary: tuple[PgCluster, PgStandby]) -> Iterator[PgHarness]:
    primary, _ = sync_primary
    name = f"t_{int(time.time() * 1000) % 10**9}"
    harness = PgHarness(primary.create_database(name))
    try:
        yield harness
    finally:
        drop_database(primary, name)


def test_a_commit_waiting_for_a_synchronous_standby_is_not_read_as_visible(
    sync_pg: PgHarness, sync_primary: tuple[PgCluster, PgStandby], tmp_path: Path
) -> None:
    """Deterministic: an update commits while the synchronous standby is down. The
    stream delivers it *before* the snapshot starts, but it stays invisible on the
    primary until the standby is back. A chunk read meanwhile sees the old rows; the
    update was delivered before the table was watched (no window holds it), so the
    chunk must not count until its read sees every commit the stream had delivered:
    it is read again once the standby is back, and the log ends with the new rows."""
    _, standby = sync_primary
    pg = sync_pg
    make_table(pg, "t1", 300)
    with Capture(pg, tmp_path, '[snapshot]\nchunk_size = 50\nwatermark = "read-only"') as cap:
        cap.caught_up()
        standby.halt()
        done = threading.Event()

        def update() -> None:
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                conn.execute("SET synchronous_commit = on")
                conn.execute("UPDATE t1 SET n = 100, v = 'new' WHERE id IN (7, 123, 299)")
            done.set()

        th = threading.Thread(target=update, daemon=True)
        th.start()
        try:
            cap.wait_until(lambda ev: sum(1 for e in ev if e["op"] == "u") == 3,
                           what="the updates in the log")
            assert not done.is_set(), "the update did not wait for the synchronous standby"
            with psycopg.connect(pg.dsn) as conn:
                assert conn.execute("SELECT v FROM t1 WHERE id = 7").fetchone() == ("v7",)
            scans = _scans(pg.dsn)
            pg.signal(sid(), "execute-snapshot", {"data-collections": [q(pg, "t1")]})
            # Evidence, not a fixed sleep: t1 scanned twice more (the start's max key and
            # at least one chunk) while the update is invisible (wrongly emitted without
            # the fence's floor check).
            deadline = time.monotonic() + 60
            while _scans(pg.dsn) < scans + 2:
                assert time.monotonic() < deadline, "no chunk was read while the standby was down"
                time.sleep(0.2)
        finally:
            standby.resume()
            th.join(timeout=60)
        assert done.is_set()
        cap.wait_notification("COMPLETED", timeout=60)
        events = cap.assert_oracle({"t1": ["id"]})
    assert len(snapshot_rows(events, "t1")) == 300


def _scans(dsn: str) -> int:
    """Scans of t1 so far (the statistics a backend flushed: at most ~1 s late)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) "
                           "FROM pg_stat_user_tables WHERE relname = 't1'").fetchone()
    assert row is not None
    return int(row[0])
