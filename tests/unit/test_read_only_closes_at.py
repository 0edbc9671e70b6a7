"""``SnapshotCore.closes_at`` (read-only): true exactly when ``on_progress`` at that
point closes a window, one chunk at a time and with concurrent windows. The runner
flushes the stream's pending events before such a call (``test_runner_window_flush``),
so a wrong answer would either leave them waiting for the chunk's rows (false) or add
empty batches (true)."""

from __future__ import annotations

from collections.abc import Sequence

from pydblog.core import (
    BoundsRequest,
    ChunkRequest,
    CoreSettings,
    SnapshotCore,
    TableStartRequest,
    parse_signal,
)
from pydblog.events import Emitted, Op, expand
from pydblog.ports import TableInfo
from tests.unit.test_read_only_core import Fence, commit, rows, started, update


def read_ids(out: Sequence[Emitted]) -> list[object]:
    return [e.after["id"] for e in expand(out) if e.op is Op.READ and e.after]


def test_one_chunk_at_a_time() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    started(core)
    assert not core.closes_at(commit(100))  # nothing read yet
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    assert not core.closes_at(commit(100))  # requested, not answered
    core.on_chunk_read(req.id, rows(1, 2, 3), 1.0, fence=Fence(frozenset(), end=5))
    assert not core.closes_at(commit(4))
    assert core.on_progress(commit(4), commit(4), 0) == []
    core.on_event(update(2, 5, tx=12))
    assert core.closes_at(commit(5))
    assert read_ids(core.on_progress(commit(5), commit(5), 0)) == [1, 3]
    assert not core.closes_at(commit(6))  # emitted: nothing left to close


def test_concurrent_windows_close_at_the_head_range_only() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=2, read_only=True, parallelism=2), instance="t")
    signal = parse_signal("s1", "execute-snapshot", '{"data-collections": ["public\\\\.t"]}')
    core.on_signal(signal, ["public.t"], commit(1), 0)
    start = core.next_request()
    assert isinstance(start, TableStartRequest) and start.concurrent and start.watermark is None
    info = TableInfo("public", "t", ("id", "v"), ("int", "text"), ("id",))
    core.on_table_started(start.id, info, (8,), None, Fence(frozenset(), end=2))
    core.on_progress(commit(2), commit(2), 0)
    b = core.next_request()
    assert isinstance(b, BoundsRequest)
    core.on_bounds(b.id, [(2,), (4,), (6,), (8,)])
    r1, r2 = core.next_request(), core.next_request()
    assert isinstance(r1, ChunkRequest) and isinstance(r2, ChunkRequest)
    assert r1.fenced and r1.low_watermark is None and r1.high_watermark is None
    # The second range's fence is passed first: its rows wait for the head range.
    core.on_chunk_read(r2.id, rows(3, 4), 1.0, fence=Fence(frozenset(), end=3))
    assert not core.closes_at(commit(10))
    assert read_ids(core.on_progress(commit(10), commit(10), 0)) == []
    core.on_chunk_read(r1.id, rows(1, 2), 1.0, fence=Fence(frozenset(), end=11))
    assert not core.closes_at(commit(10))
    assert core.closes_at(commit(11))
    assert read_ids(core.on_progress(commit(11), commit(11), 0)) == [1, 2, 3, 4]
    assert not core.closes_at(commit(12))


def test_watermark_snapshots_never_close_at_progress() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=4, read_ahead=False, fenced=True), instance="t")
    assert not core.closes_at(commit(1))


def test_a_window_handing_out_slices_closes_nothing_more() -> None:
    """With slices (``slice_rows``), the head window's first slice lands where it closes;
    while the rest is handed out (``draining``) no commit closes it again: the runner
    must not flush the stream's events before every one of them."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, parallelism=2, slice_rows=1),
                        instance="t")
    signal = parse_signal("s1", "execute-snapshot", '{"data-collections": ["public\\\\.t"]}')
    core.on_signal(signal, ["public.t"], commit(1), 0)
    start = core.next_request()
    assert isinstance(start, TableStartRequest)
    info = TableInfo("public", "t", ("id", "v"), ("int", "text"), ("id",))
    core.on_table_started(start.id, info, (8,), None, Fence(frozenset(), end=2))
    core.on_progress(commit(2), commit(2), 0)
    b = core.next_request()
    assert isinstance(b, BoundsRequest)
    core.on_bounds(b.id, [(4,), (8,)])
    r1 = core.next_request()
    assert isinstance(r1, ChunkRequest)
    core.on_chunk_read(r1.id, rows(1, 2, 3, 4), 1.0, fence=Fence(frozenset(), end=3))
    assert core.closes_at(commit(3))
    assert read_ids(core.on_progress(commit(3), commit(3), 0)) == [1]  # the first slice
    assert core.draining
    assert not core.closes_at(commit(4))  # handing out, not closing
    assert read_ids(core.on_boundary(commit(4), 0)) == [2]
    assert not core.closes_at(commit(5))
