"""The embedded change log: blocks, offsets, checkpoints, readers, retention."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog import sqlite as sqlite_log
from pydblog.changelog.sqlite import BLOCK_EVENTS, SqliteChangeLog, SqliteChangeLogReader
from pydblog.events import EncodedEvent, with_offset
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition


def ev(i: int, table: str = "public.t", ts: int | None = None) -> EncodedEvent:
    body = orjson.dumps({"op": "c", "i": i, "text": "line\nbreak"}).decode()
    return EncodedEvent(table, "c", ts if ts is not None else i, body)


def cp(n: int) -> Checkpoint:
    return Checkpoint(PgPosition(Lsn(n), 0, Lsn(n)), {"n": n})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2500), min_size=1, max_size=6),
       st.integers(min_value=0, max_value=6000), st.integers(min_value=1, max_value=3000))
def test_offsets_are_dense_and_reads_exact(sizes: list[int], start: int, limit: int) -> None:
    import tempfile

    d = Path(tempfile.mkdtemp())
    log = SqliteChangeLog(d)
    total = 0
    for n in sizes:
        assert log.append([ev(total + i, f"public.t{(total + i) % 3}") for i in range(n)], cp(total)) == total + n
        total += n
    reader = SqliteChangeLogReader(d)
    assert reader.next_offset() == total
    got = reader.read(start, limit)
    assert [r.offset for r in got] == list(range(start, min(total, start + limit)))
    for r in got:
        assert orjson.loads(r.body)["i"] == r.offset and r.table == f"public.t{r.offset % 3}"
    filtered = reader.read(start, limit, ["public.t1"])
    assert [r.offset for r in filtered] == [o for o in range(start, total) if o % 3 == 1][:limit]
    assert [r.offset for r in reader.read_range(start, start + limit)] == list(
        range(start, min(total, start + limit))
    )


def test_with_offset_puts_the_offset_first() -> None:
    assert with_offset(7, b'{"op":"c"}') == b'{"offset":7,"op":"c"}'


def test_retention_by_age_and_size_keeps_a_prefix_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SqliteChangeLog(tmp_path)
    now = time.time()
    old = [ev(i, ts=int(now * 1000)) for i in range(3 * BLOCK_EVENTS)]
    new = [ev(i, ts=int(now * 1000)) for i in range(3 * BLOCK_EVENTS, 4 * BLOCK_EVENTS)]
    monkeypatch.setattr(sqlite_log, "_now_ms", lambda: int((now - 10 * 3600) * 1000))
    log.append(old, cp(1))  # appended 10 hours ago
    monkeypatch.setattr(sqlite_log, "_now_ms", lambda: int(now * 1000))
    log.append(new, cp(2))
    removed = log.enforce_retention(3_600_000, None)
    reader = SqliteChangeLogReader(tmp_path)
    assert removed == 3 * BLOCK_EVENTS
    assert reader.first_offset() == 3 * BLOCK_EVENTS and reader.next_offset() == 4 * BLOCK_EVENTS
    log.append([ev(i, ts=int(now * 1000)) for i in range(4 * BLOCK_EVENTS, 8 * BLOCK_EVENTS)], cp(3))
    before = log.size_bytes()
    assert log.enforce_retention(None, before // 2) > 0
    first = reader.first_offset()
    assert 3 * BLOCK_EVENTS < first < 8 * BLOCK_EVENTS
    assert [r.offset for r in reader.read(0, 3)] == [first, first + 1, first + 2]
    assert reader.next_offset() == 8 * BLOCK_EVENTS


def test_retention_ages_blocks_by_append_time_not_event_time(tmp_path: Path) -> None:
    """A capture lagging more than the retention age appends events whose source time is
    old: retention must not delete what was just written (it aged blocks by event time)."""
    log = SqliteChangeLog(tmp_path)
    old_ts = int(time.time() * 1000) - 10 * 3_600_000
    log.append([ev(i, ts=old_ts) for i in range(2 * BLOCK_EVENTS)], cp(1))
    log.append([ev(i, ts=old_ts) for i in range(2 * BLOCK_EVENTS, 3 * BLOCK_EVENTS)], cp(2))
    assert log.enforce_retention(3_600_000, None) == 0
    assert SqliteChangeLogReader(tmp_path).first_offset() == 0


def _writer(directory: str, batches: int) -> None:
    log = SqliteChangeLog(directory)
    for b in range(batches):
        log.append([ev(b * 100 + i) for i in range(100)], cp(b))


def test_reader_in_another_process_sees_whole_batches(tmp_path: Path) -> None:
    SqliteChangeLog(tmp_path).close()
    proc = multiprocessing.get_context("spawn").Process(target=_writer, args=(str(tmp_path), 200))
    proc.start()
    reader = SqliteChangeLogReader(tmp_path)
    seen = 0
    while proc.is_alive() or seen < 20_000:
        n = reader.next_offset()
        assert n % 100 == 0  # never half a batch
        recs = reader.read(seen, 100_000)
        assert [r.offset for r in recs][: n - seen] == list(range(seen, n))
        seen = max(seen, recs[-1].offset + 1) if recs else seen
        if seen >= 20_000:
            break
    proc.join()
    assert seen == 20_000
