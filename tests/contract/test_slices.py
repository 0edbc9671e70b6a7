"""Snapshot windows handed to the change log in slices (``driver.SLICE_ROWS``,
``core.flight`` "Slices") against real servers: a chunk's rows go out a slice at a
time, one at its high watermark and the rest at the stream's later transaction
boundaries, with the stream's events of those transactions logged between the slices;
the window stays open until each slice is out. The oracle must hold, also across
kill -9s at random points while chunks are half handed out.

The slices are made small here (``PYDBLOG_SLICE_ROWS=1024``: one of the change log's
blocks) against chunks of several blocks, so every chunk is cut into several slices.
PostgreSQL's watermark windows are fenced, where slices have a known wrong-result bug
(docs/snapshots.md): there the setting must be ignored, with a warning, and every
window logged whole."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tests.contract.capture import Capture, Event
from tests.contract.harness import Harness
from tests.contract.test_parallel import LogProgress, big_table, sized
from tests.contract.test_snapshots import q, writer
from tests.helpers import sid


def between_slices(events: list[Event], table: str) -> int:
    """Stream events of ``table`` logged between two snapshot rows of ``table`` with no
    notification between them: a range's IN_PROGRESS notice lands with its last slice,
    so such rows are slices of one chunk."""
    found = 0
    stream = 0
    in_chunk = False
    for e in events:
        if e["op"] == "n":
            in_chunk, stream = False, 0
        elif e["source"].get("table") != table:
            continue
        elif e["op"] == "r":
            found += stream if in_chunk else 0
            in_chunk, stream = True, 0
        elif in_chunk:
            stream += 1
    return found


def test_slices_ignored_on_fenced_windows(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's windows are fenced: PYDBLOG_SLICE_ROWS is ignored there (a known
    wrong-result bug, docs/snapshots.md), with a warning, and the log stays exact."""
    if not harness.name.startswith("postgres"):
        pytest.skip("windows are fenced on PostgreSQL only")
    _sliced_snapshot(harness, tmp_path, monkeypatch)


@pytest.mark.slow
def test_slices_interleave_stream_events(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MySQL/MariaDB (unfenced windows): stream events land between slices of a chunk.
    Slow: whether a stream event falls between two slices depends on the timing (it
    failed 1 run in 2-3 on a loaded machine); slices are off by default."""
    if harness.name.startswith("postgres"):
        pytest.skip("slices are ignored on fenced windows")
    _sliced_snapshot(harness, tmp_path, monkeypatch)


def _sliced_snapshot(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    monkeypatch.setenv("PYDBLOG_SLICE_ROWS", "1024")
    rows, chunk = sized(h, 100_000, 8192)
    big_table(h, rows)
    with Capture(h, tmp_path, f"[snapshot]\nchunk_size = {chunk}\nparallelism = 2") as cap:
        stop = threading.Event()
        th = threading.Thread(target=writer, args=(h, "t1", stop, 5, rows + rows // 10))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            cap.wait_notification("COMPLETED", timeout=180)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    if h.name.startswith("postgres"):  # fenced windows: slices ignored (a known bug)
        assert "PYDBLOG_SLICE_ROWS=1024 ignored" in err, err[-3000:]
        assert between_slices(events, "t1") == 0
    else:
        assert "PYDBLOG_SLICE_ROWS" not in err, err[-3000:]
        assert between_slices(events, "t1") > 0


@pytest.mark.slow
def test_sliced_windows_survive_kill9_at_random_points(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four kill -9s at random points of the snapshot's progress (at least one before
    it completed) while chunks of 8 slices are handed out under a write load: each
    restart resumes after the last slice logged (the table's progress moves slice by
    slice), and the change log materializes to the table."""
    h = harness
    if h.name.startswith("postgres"):
        pytest.skip("PostgreSQL's windows are fenced: slices are ignored there (a known bug)")
    monkeypatch.setenv("PYDBLOG_SLICE_ROWS", "1024")
    rows, chunk = sized(h, 2_000_000, 8192)  # (at 120k-600k rows PostgreSQL's snapshot
    # ended before the kills meant for its middle)
    big_table(h, rows)
    rng = random.Random(16)
    with Capture(h, tmp_path, f"[snapshot]\nchunk_size = {chunk}\nparallelism = 2") as cap:
        stop = threading.Event()
        th = threading.Thread(target=writer, args=(h, "t1", stop, 13, rows + rows // 12))
        th.start()
        try:
            progress = LogProgress(cap)  # (waiting for IN_PROGRESS first was too slow:
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            mid = 0  # PostgreSQL had logged the whole table by then)
            for target in sorted(rng.uniform(0.05, 0.8) * rows for _ in range(4)):
                progress.wait(target)
                time.sleep(rng.uniform(0.0, 0.05))
                mid += not progress.done()
                cap.kill()
                cap.start()
            cap.wait_notification("COMPLETED", timeout=240)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"t1": ["id"]})
        cap.stop()
    assert mid >= 1  # (PostgreSQL resumes and ends within a poll or two after a kill)
    done = [e for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED"]
    assert len(done) == 1
    assert between_slices(events, "t1") > 0
