"""Concurrent chunk windows (``[snapshot] parallelism = 4``, ``core.flight``) against
real servers (PostgreSQL, MariaDB, MySQL 5.7): up to four chunks are read at once on four
connections, each in its own L/H window (read-only: its own fence), while a writer
changes the table; the oracle must hold, also across a kill -9 in the middle of the
parallel chunks. MySQL/MariaDB tables are smaller (their chunk reads are slower) and cut
into smaller chunks, so four are still in flight at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pydblog.changelog import log_exists, open_reader
from pydblog.ports import ChangeLogReader
from tests.chaos import at_progress, kill_and_restart, kill_seed, reporting, writing
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import Harness
from tests.contract.test_snapshots import q, writer
from tests.helpers import sid


def big_table(h: Harness, rows: int) -> None:
    """``t1 (id, v, n)`` with ids ``0 .. rows - 1``."""
    h.execute("CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
    if h.name.startswith("postgres"):
        h.execute(
            f"INSERT INTO t1 SELECT g, 'v' || g, g % 7 FROM generate_series(0, {rows - 1}) g"
        )
        return
    for lo in range(0, rows, 10_000):
        values = ", ".join(f"({i}, 'v{i}', {i % 7})" for i in range(lo, min(rows, lo + 10_000)))
        h.execute(f"INSERT INTO t1 (id, v, n) VALUES {values}")


class LogProgress:
    """How far the snapshot is, cheaply enough to keep up with it: ``rows`` is the
    number of events logged (snapshot rows, plus the few of the writer and of the
    notifications: an estimate that is a little early), from the log's next offset;
    ``done`` looks for COMPLETED among the events logged since its last look (at most
    the last ``TAIL`` of them). Decoding every event instead fell behind a PostgreSQL
    snapshot of 120k rows (~40k events/s decoded, as fast as the snapshot wrote them),
    so the kills meant for its middle landed after its end."""

    TAIL = 4_000  # ~8 s of the writer's events after a COMPLETED

    def __init__(self, cap: Capture) -> None:
        self.cap = cap
        self.rows = 0
        self.completed = False
        self._at = 0
        self._reader: ChangeLogReader | None = None

    def _open(self) -> ChangeLogReader | None:
        if self._reader is None and log_exists(self.cap.log_cfg):
            self._reader = open_reader(self.cap.log_cfg)
        return self._reader

    def done(self) -> bool:
        reader = self._open()
        if reader is None or self.completed:
            return self.completed
        end = reader.next_offset()
        for rec in reader.read(max(self._at, end - self.TAIL), end - self._at):
            if rec.op == "n" and b'"COMPLETED"' in rec.body:
                self.completed = True
        self._at = end
        return self.completed

    def wait(self, rows: float, timeout: float = 240) -> None:
        """Until about ``rows`` events are in the log, or the snapshot completed."""
        deadline = time.monotonic() + timeout
        while True:
            reader = self._open()
            self.rows = reader.next_offset() if reader is not None else 0
            if self.rows >= rows or self.done():
                return
            assert time.monotonic() < deadline, f"timed out waiting for {rows:.0f} rows"
            time.sleep(0.005)


def sized(h: Harness, pg_rows: int, pg_chunk: int) -> tuple[int, int]:
    """(rows, chunk size) for this source: a quarter of the rows and of the chunk size
    on MySQL/MariaDB (the same number of chunks in flight)."""
    if h.name.startswith("postgres"):
        return pg_rows, pg_chunk
    return pg_rows // 4, max(64, pg_chunk // 4)


@pytest.mark.mysql57
def test_parallel_chunks_with_writes(harness: Harness, tmp_path: Path) -> None:
    h = harness
    rows, chunk = sized(h, 30_000, 8192)
    big_table(h, rows)
    with Capture(h, tmp_path, f"[snapshot]\nchunk_size = {chunk}\nparallelism = 4") as cap:
        with writing(lambda stop: writer(h, "t1", stop, 7, rows + rows // 10)):
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            cap.wait_notification("COMPLETED", timeout=180)
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    assert len(snapshot_rows(events, "t1")) > rows * 2 // 3
    assert "up to 4 read at once" in err


@pytest.mark.slow
@pytest.mark.mysql57
def test_parallel_chunks_resume_after_kill9(harness: Harness, tmp_path: Path) -> None:
    h = harness
    rows, chunk = sized(h, 40_000, 8192)
    big_table(h, rows)
    cap = Capture(h, tmp_path, f"[snapshot]\nchunk_size = {chunk}\nparallelism = 4").start()
    with writing(lambda stop: writer(h, "t1", stop, 8, rows + rows // 10)):
        h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
        # One kill, at the second IN_PROGRESS (no random delay).
        kills = kill_and_restart(cap.kill, cap.start, 1, kill_seed(8), delay=(0.0, 0.0),
                                 each_round=lambda n, rng: cap.wait_notification("IN_PROGRESS",
                                                                                 count=2))
        with reporting(kills):
            cap.wait_notification("COMPLETED", timeout=180)
    with reporting(kills):
        events = cap.assert_oracle({"t1": ["id"]})
        cap.stop()
        assert sum(1 for e in events
                   if e["op"] == "n" and e["notification"]["type"] == "COMPLETED") == 1


@pytest.mark.slow
@pytest.mark.mysql57
@pytest.mark.parametrize("watermark", ["table", "read-only"])
def test_parallel_chunks_survive_kill9_at_random_points(
    harness: Harness, tmp_path: Path, watermark: str
) -> None:
    """Three kill -9s at random points while four windows are in flight (some read,
    some waiting for their H or fence, some waiting for an earlier range), under a
    write load; every restart resumes after the emitted prefix, and the change log
    materializes to the table."""
    h = harness
    if watermark == "read-only":
        from tests.contract.test_read_only import read_only  # (it imports this module)

        h = read_only(h)  # MySQL: a capture user that cannot write; the signal table made
    # 600k rows on PostgreSQL: with the native chunk and stream paths a quiet machine
    # finished a 120k-row snapshot before the first kill.
    rows, chunk = sized(h, 600_000, 512)
    big_table(h, rows)
    settings = f'[snapshot]\nchunk_size = {chunk}\nparallelism = 4\nwatermark = "{watermark}"'
    with Capture(h, tmp_path, settings) as cap:
        with writing(lambda stop: writer(h, "t1", stop, 11, rows + rows // 12)):
            # Following the log from before the signal: its first look at a fast
            # snapshot otherwise comes late.
            progress = LogProgress(cap)
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            # No wait for IN_PROGRESS: ``wait_notification`` decodes every event logged
            # so far before it looks, ~40k events/s, slower than a parallel snapshot
            # writes them; a loaded run found IN_PROGRESS only after COMPLETED (mid = 0).
            mid: list[bool] = []  # per kill: before the snapshot completed
            # At random points of the snapshot's progress (not of the clock: how fast
            # a snapshot runs depends on the server and the machine's load), then up to
            # 50 ms more.
            def kill() -> None:
                mid.append(not progress.done())
                cap.kill()

            kills = kill_and_restart(
                kill, cap.start, 3, kill_seed(11 if watermark == "table" else 12),
                delay=(0.0, 0.05),
                each_round=at_progress(progress.wait, 3, 0.05 * rows, 0.7 * rows),
                note=lambda: f"{progress.rows} events logged, mid-snapshot {mid[-1]}")
            with reporting(kills):
                cap.wait_notification("COMPLETED", timeout=240)
        with reporting(kills):
            events = cap.assert_oracle({"t1": ["id"]})
        cap.stop()
    with reporting(kills):
        assert sum(mid) >= 2
        done = [e for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED"]
        assert len(done) == 1
