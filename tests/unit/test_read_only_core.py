"""Read-only snapshots in the core, step by step: fences instead of watermarks."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydblog.core import ChunkRequest, CoreSettings, SnapshotCore, TableStartRequest, parse_signal
from pydblog.core.fence import Lost
from pydblog.events import ChangeEvent, Op, expand
from pydblog.ports import TableInfo
from pydblog.positions import Lsn, PgPosition, Position


@dataclass(frozen=True)
class Fence:
    """Saw every transaction id below ``next_xid`` but ``invisible``; the log's end
    was ``end``."""

    invisible: frozenset[int]
    end: int
    next_xid: int = 12
    replayed: int | None = None  # a standby's: every commit before this lsn (None: all)

    def visible(self, event: ChangeEvent) -> bool | None:
        tx = getattr(event.position, "tx_id", None)
        return None if tx is None else tx < self.next_xid and tx not in self.invisible

    def covers(self, position: Position) -> bool:
        assert isinstance(position, PgPosition)
        return self.replayed is None or position.commit_lsn.value < self.replayed

    def settles(self, event: ChangeEvent) -> bool:
        return self.visible(event) is True

    def settles_lost(self, lost: Lost) -> bool:
        return lost.max_tx is not None and lost.max_tx < min(self.invisible, default=self.next_xid)

    def passed(self, reached: Position) -> bool:
        assert isinstance(reached, PgPosition)
        return reached.ack_lsn.value >= self.end


def commit(lsn: int, index: int = 1) -> PgPosition:
    return PgPosition(Lsn(lsn), index, Lsn(lsn))


def update(k: int, lsn: int, tx: int) -> ChangeEvent:
    return ChangeEvent(Op.UPDATE, "public", "t", PgPosition(Lsn(lsn), 0, None, tx), 0,
                       key={"id": k}, after={"id": k, "v": f"tx{tx}"})


def started(core: SnapshotCore) -> None:
    signal = parse_signal("s1", "execute-snapshot", json.dumps({"data-collections": ["public\\.t"]}))
    core.on_signal(signal, ["public.t"], PgPosition(Lsn(1)), 0)
    req = core.next_request()
    assert isinstance(req, TableStartRequest) and req.watermark is None
    info = TableInfo("public", "t", ("id", "v"), ("int", "text"), ("id",))
    core.on_table_started(req.id, info, (9,))
    assert core.waiting_for_progress
    out = expand(core.on_progress(commit(2), commit(2), 0))
    assert [e.notification["type"] for e in out if e.notification] == ["TABLE_SCAN_STARTED"]


def rows(*keys: int) -> list[dict[str, object]]:
    return [{"id": k, "v": "old"} for k in keys]


def test_an_event_delivered_before_the_read_but_unseen_by_it_drops_its_key() -> None:
    """A commit the stream delivered before the chunk was even requested can still be
    invisible to the read (a commit waiting for a synchronous standby): the row is older
    than that event and must not be emitted after it."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    started(core)
    core.on_event(update(1, 3, tx=10))  # delivered, not yet visible
    assert core.on_progress(commit(3), commit(3), 0) == []
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.fenced and req.low_watermark is None
    core.on_chunk_read(req.id, rows(1, 2, 3), 1.0, fence=Fence(frozenset({10}), end=3))
    out = expand(core.on_progress(commit(3), commit(3), 0))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [2, 3]


def test_rows_wait_until_the_stream_passed_every_commit_the_read_saw() -> None:
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    started(core)
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    core.on_chunk_read(req.id, rows(1, 2, 3), 1.0, fence=Fence(frozenset({11}), end=5))
    assert core.on_progress(commit(4), commit(4), 0) == []  # the read saw commits up to 5
    core.on_event(update(2, 5, tx=12))  # committed after the read: newer than the row
    core.on_event(update(3, 5, tx=9))  # seen by the read: the row already has it
    out = expand(core.on_progress(commit(5), commit(5), 0))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [1, 3]
    assert all(e.position > commit(5) for e in out)
    # the table is done (a short chunk): the next progress places nothing more
    assert core.next_request() is None


def test_a_restart_distrusts_what_was_unsettled() -> None:
    """Unsettled events are not persisted, only their summary: after a restart windows
    stay inconclusive (the chunk is read again) until a fence settles them."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="a")
    started(core)
    core.on_event(update(1, 3, tx=10))
    state = core.state()
    assert state is not None and state["unsettled"]["max_tx"] == 10
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False),
                        json.loads(json.dumps(state)), instance="b")
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    core.on_chunk_read(req.id, rows(1, 2), 1.0, fence=Fence(frozenset({10}), end=3))
    assert [e for e in expand(core.on_progress(commit(3), commit(3), 0)) if e.op is Op.READ] == []
    req = core.next_request()  # read again; tx 10 is visible now
    assert isinstance(req, ChunkRequest) and req.after_key is None
    core.on_chunk_read(req.id, rows(1, 2), 1.0, fence=Fence(frozenset(), end=4))
    out = expand(core.on_progress(commit(4), commit(4), 0))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [1, 2]


def test_a_commit_delivered_before_the_snapshot_began_needs_a_fence_that_covers_it() -> None:
    """A hot standby lags the stream: the update of key 1 was delivered (and logged)
    before the table was watched, so no window holds it, and a read on a standby that
    has not replayed it yet returns the older row. Such a read's window is inconclusive
    (nothing emitted, the chunk is read again) until a fence covers where the table
    began to be watched."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    core.on_event(update(1, 1, tx=10))  # not watched yet: not kept
    started(core)  # the signal (lsn 1) watches the table from here
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    core.on_chunk_read(req.id, rows(1, 2), 1.0, fence=Fence(frozenset(), end=3, replayed=1))
    assert [e for e in expand(core.on_progress(commit(3), commit(3), 0)) if e.op is Op.READ] == []
    again = core.next_request()  # the same chunk, read again
    assert isinstance(again, ChunkRequest) and again.after_key is None and again.id != req.id
    fence = Fence(frozenset(), end=4, replayed=2)  # replayed past lsn 1: covers it
    core.on_chunk_read(again.id, rows(1, 2), 1.0, fence=fence)
    out = expand(core.on_progress(commit(4), commit(4), 0))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [1, 2]


def test_a_table_watched_before_the_stream_delivered_anything() -> None:
    """Snapshot mode "initial" at a fresh start: no position yet, so the floor is the
    first position the stream delivers (past everything it skipped)."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    core.start_initial(["public.t"])
    req = core.next_request()
    assert isinstance(req, TableStartRequest)
    info = TableInfo("public", "t", ("id", "v"), ("int", "text"), ("id",))
    core.on_table_started(req.id, info, (9,))
    core.on_progress(commit(5), commit(5), 0)
    chunk = core.next_request()
    assert isinstance(chunk, ChunkRequest)
    core.on_chunk_read(chunk.id, rows(1), 1.0, fence=Fence(frozenset(), end=5, replayed=5))
    assert [e for e in expand(core.on_progress(commit(6), commit(6), 0)) if e.op is Op.READ] == []
    chunk = core.next_request()
    assert isinstance(chunk, ChunkRequest)
    core.on_chunk_read(chunk.id, rows(1), 1.0, fence=Fence(frozenset(), end=6, replayed=6))
    out = expand(core.on_progress(commit(6), commit(6), 0))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [1]
