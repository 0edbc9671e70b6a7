"""Watermark windows judged by the read's fence too (``CoreSettings.fenced``).

PostgreSQL decodes a commit before it becomes visible, so a transaction the stream
delivered *before* a chunk's low watermark L can still be invisible to the chunk's
SELECT (a commit waiting for a synchronous standby; a few microseconds under CPU load
otherwise). DBLog's window only drops keys of events between L and H, so the stale row
landed at H after that newer event: `tests/integration/test_recreate.py` failed this
way under load, `tests/integration/test_late_visible_commit.py` forces it on a server.
"""

from __future__ import annotations

import json

from pydblog.core import ChunkRequest, CoreSettings, SnapshotCore, TableStartRequest, parse_signal
from pydblog.core.requests import BoundsRequest, KeyReadRequest
from pydblog.events import ChangeEvent, Op, expand
from pydblog.ports import TableInfo
from pydblog.positions import Lsn, PgPosition
from tests.unit.test_read_only_core import Fence, rows, update

INFO = TableInfo("public", "t", ("id", "v"), ("int", "text"), ("id",))


def at(lsn: int, index: int = 0) -> PgPosition:
    return PgPosition(Lsn(lsn), index)


def started(core: SnapshotCore) -> None:
    signal = parse_signal("s1", "execute-snapshot", json.dumps({"data-collections": ["public\\.t"]}))
    core.on_signal(signal, ["public.t"], at(1), 0)
    req = core.next_request()
    assert isinstance(req, TableStartRequest) and req.watermark is not None
    core.on_table_started(req.id, INFO, (9,))
    out = expand(core.on_watermark(req.watermark, at(2), 0))
    assert [e.notification["type"] for e in out if e.notification] == ["TABLE_SCAN_STARTED"]


def emitted(out: list[ChangeEvent]) -> list[int]:
    return [e.after["id"] for e in out if e.op is Op.READ and e.after]


def test_an_event_before_low_watermark_unseen_by_the_read_drops_its_key() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=4, read_ahead=False, fenced=True), instance="t")
    started(core)
    core.on_event(update(1, 3, tx=10))  # delivered, still invisible (waits for a standby)
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.fenced
    assert req.low_watermark is not None and req.high_watermark is not None
    core.on_event(update(2, 4, tx=11))  # delivered after the request, before L: unseen too
    core.on_event(update(3, 4, tx=9))  # seen by the read: the row already has it
    assert core.on_watermark(req.low_watermark, at(5), 0) == []
    core.on_chunk_read(req.id, rows(1, 2, 3, 4), 1.0, fence=Fence(frozenset({10, 11}), end=6))
    out = expand(core.on_watermark(req.high_watermark, at(7), 0))
    assert emitted(out) == [3, 4]
    assert all(e.position > at(7) for e in out)


def test_events_between_the_watermarks_still_drop_their_keys() -> None:
    """Inside the window every event unseen by the read drops its key (as without a
    fence); one the read saw stays (the row includes it, and lands after it)."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_ahead=False, fenced=True), instance="t")
    started(core)
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.low_watermark and req.high_watermark
    core.on_watermark(req.low_watermark, at(3), 0)
    core.on_event(update(1, 4, tx=10))
    core.on_chunk_read(req.id, rows(1, 2, 3), 1.0, fence=Fence(frozenset(), end=5, next_xid=11))
    core.on_event(update(2, 6, tx=12))  # after the read
    out = expand(core.on_watermark(req.high_watermark, at(7), 0))
    assert emitted(out) == [1, 3]


def test_a_chunk_without_its_fence_is_refused() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=4, read_ahead=False, fenced=True), instance="t")
    started(core)
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.low_watermark and req.high_watermark
    core.on_watermark(req.low_watermark, at(3), 0)
    core.on_chunk_read(req.id, rows(1, 2), 1.0)
    out = expand(core.on_watermark(req.high_watermark, at(4), 0))
    assert emitted(out) == []


def test_read_ahead_chunks_are_fenced_too() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=2, fenced=True), instance="t")
    started(core)
    first = core.next_request()
    assert isinstance(first, ChunkRequest) and first.low_watermark and first.high_watermark
    core.on_watermark(first.low_watermark, at(3), 0)
    core.on_chunk_read(first.id, rows(1, 2), 1.0, fence=Fence(frozenset(), end=3))
    ahead = core.next_request()
    assert isinstance(ahead, ChunkRequest) and ahead.fenced and ahead.after_key == (2,)
    core.on_event(update(4, 4, tx=10))  # before the read-ahead's L, unseen by its read
    assert emitted(expand(core.on_watermark(first.high_watermark, at(5), 0))) == [1, 2]
    assert ahead.low_watermark and ahead.high_watermark
    core.on_watermark(ahead.low_watermark, at(6), 0)
    core.on_chunk_read(ahead.id, rows(3, 4), 1.0, fence=Fence(frozenset({10}), end=6))
    assert emitted(expand(core.on_watermark(ahead.high_watermark, at(7), 0))) == [3]


def test_concurrent_windows_are_fenced_too() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=2, fenced=True, parallelism=2), instance="t")
    signal = parse_signal("s1", "execute-snapshot", json.dumps({"data-collections": ["public\\.t"]}))
    core.on_signal(signal, ["public.t"], at(1), 0)
    start = core.next_request()
    assert isinstance(start, TableStartRequest) and start.concurrent and start.watermark
    core.on_table_started(start.id, INFO, (4,))
    core.on_watermark(start.watermark, at(2), 0)
    bounds = core.next_request()
    assert isinstance(bounds, BoundsRequest)
    core.on_bounds(bounds.id, [(2,), (4,)])
    first, second = core.next_request(), core.next_request()
    assert isinstance(first, ChunkRequest) and isinstance(second, ChunkRequest)
    assert first.fenced and second.fenced and first.high_watermark and second.high_watermark
    core.on_event(update(3, 3, tx=10))  # delivered before either L, unseen by the reads
    for req in (first, second):
        assert req.low_watermark
        core.on_watermark(req.low_watermark, at(4), 0)
    core.on_chunk_read(first.id, rows(1, 2), 1.0, fence=Fence(frozenset({10}), end=4))
    core.on_chunk_read(second.id, rows(3, 4), 1.0, fence=Fence(frozenset({10}), end=4))
    out = expand(core.on_watermark(second.high_watermark, at(5), 0))
    out += expand(core.on_watermark(first.high_watermark, at(6), 0))
    assert emitted(out) == [1, 2, 4]


def test_key_rereads_are_fenced_too() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=4, read_ahead=False, fenced=True), instance="t")
    partial = ChangeEvent(Op.CREATE, "public", "t", PgPosition(Lsn(3), 0, None, 5), 0,
                          key={"id": 7}, after={"id": 7}, unchanged=("v",))
    core.on_event(partial)  # a key change's create: the row is re-read
    req = core.next_request()
    assert isinstance(req, KeyReadRequest) and req.fenced
    assert req.low_watermark is not None and req.high_watermark is not None
    core.on_event(update(7, 4, tx=10))  # before L, unseen by the read
    core.on_watermark(req.low_watermark, at(5), 0)
    core.on_chunk_read(req.id, rows(7), 1.0, fence=Fence(frozenset({10}), end=5))
    assert emitted(expand(core.on_watermark(req.high_watermark, at(6), 0))) == []


def delete(k: int, lsn: int, tx: int) -> ChangeEvent:
    return ChangeEvent(Op.DELETE, "public", "t", PgPosition(Lsn(lsn), 0, None, tx), 0,
                       key={"id": k})


def run_blocking(core: SnapshotCore, stale: int, fresh_rows: list[int]) -> list[ChangeEvent]:
    """Answers the blocking snapshot's requests until it ends: the first ``stale`` reads
    as a SELECT that does not see transaction 10 yet (rows 1-4), the rest as one that
    sees it (``fresh_rows``). Returns the events."""
    out: list[ChangeEvent] = []
    for reads in range(50):
        if not core.blocking:
            return out
        req = core.next_request()
        assert req is not None, req
        old = reads < stale
        fence = (Fence(frozenset({10}), end=3, replayed=2) if old
                 else Fence(frozenset(), end=3))
        keys = [1, 2, 3, 4] if old else fresh_rows
        if isinstance(req, TableStartRequest):
            out += expand(core.on_table_started(req.id, INFO, (max(keys),), fence=fence))
        else:
            assert isinstance(req, ChunkRequest)
            after = req.after_key[0] if req.after_key else 0
            got = [k for k in keys if after < k <= req.max_key[0]][: req.limit]
            out += expand(core.on_chunk_read(req.id, rows(*got), 1.0, fence=fence))
    raise AssertionError("the blocking snapshot does not end")


def blocking_core(settings: CoreSettings | None = None) -> SnapshotCore:
    core = SnapshotCore(settings or CoreSettings(chunk_size=4, fenced=True), instance="t")
    core.on_event(delete(3, lsn=2, tx=10))  # delivered, still invisible
    signal = parse_signal("b1", "execute-snapshot", json.dumps(
        {"data-collections": ["public\\.t"], "type": "blocking"}))
    core.on_signal(signal, ["public.t"], at(3), 0)
    assert core.blocking
    core.on_stream_paused(at(3), 0)
    return core


def test_a_blocking_read_does_not_resurrect_a_delivered_delete_it_cannot_see_yet() -> None:
    """A blocking snapshot's SELECT can miss a commit the stream already delivered (it
    waits for a synchronous standby): before, the blocking chunk emitted the deleted row
    after its delete, and nothing ever removed it again (the change log materialized
    a row the source no longer had; the property simulation's blocking snapshots found
    it). Blocking reads are fenced too: one whose fence does not show every transaction
    delivered before the table was queued is read again."""
    for stale in (1, 2, 3):  # the start's read misses the delete; also the chunk's; twice
        assert emitted(run_blocking(blocking_core(), stale, [1, 2, 4])) == [1, 2, 4], stale


def test_blocking_reads_fenced_alone() -> None:
    """``fenced_blocking`` (MySQL/MariaDB, whose watermark windows are exact without
    fences): blocking reads are judged by their fences as with ``fenced``; unfenced, the
    stale read lands the deleted row again (tests/mysql/test_semisync.py on a server)."""
    alone = CoreSettings(chunk_size=4, fenced_blocking=True)
    for stale in (1, 2, 3):
        assert emitted(run_blocking(blocking_core(alone), stale, [1, 2, 4])) == [1, 2, 4], stale
    unfenced = run_blocking(blocking_core(CoreSettings(chunk_size=4)), 2, [1, 2, 4])
    assert emitted(unfenced) == [1, 2, 3, 4]  # the bug the fences close


def test_fenced_blocking_leaves_watermark_windows_unfenced() -> None:
    """With ``fenced_blocking`` alone, incremental requests carry watermarks and no
    ``fenced``, and only the blocking lane's tables' events are kept."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_ahead=False, fenced_blocking=True),
                        instance="t")
    started(core)
    core.on_event(update(1, 3, tx=10))
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and not req.fenced and req.low_watermark
    assert core._fencing.unsettled.events == []  # (an incremental table's events are not kept)
    assert core._fencing.unsettled.floor is None
    assert req.high_watermark is not None
    core.on_watermark(req.low_watermark, at(5), 0)
    core.on_chunk_read(req.id, rows(1, 2, 3, 4), 1.0)
    out = expand(core.on_watermark(req.high_watermark, at(6), 0))
    assert emitted(out) == [1, 2, 3, 4]  # (an event before L: exact without a fence here)
