"""Read-only snapshots in the core, step by step: fences instead of watermarks."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydblog.core import ChunkRequest, CoreSettings, SnapshotCore, TableStartRequest, parse_signal
from pydblog.core.fence import LOST_XIDS, Delivered, Floor, Lost, Unsettled
from pydblog.events import ChangeEvent, Op, expand
from pydblog.ports import TableInfo
from pydblog.positions import Lsn, PgPosition, Position
from pydblog.sources.postgres.fences import PgXidFence


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

    def covers(self, floor: Floor) -> bool:
        position = floor.position
        assert isinstance(position, PgPosition)
        return self.replayed is None or position.commit_lsn.value < self.replayed

    def in_doubt(self) -> None:
        return None

    def in_commit(self) -> None:
        return None

    def sees_tx(self, tx: int) -> bool:
        return False

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


def xid_fence(xmin: int, xmax: int, xip: str, end: int, running: set[int]) -> PgXidFence:
    """A primary's fence (the real one): snapshot ``xmin:xmax:xip``, running xids."""
    return PgXidFence.parse(f"{xmin}:{xmax}:{xip}", f"0/{end:X}", [str(x) for x in running])


def test_a_commit_still_waiting_for_a_synchronous_standby_keeps_the_floor_open() -> None:
    """On a primary, tx 10 was delivered before the table was watched but still waits
    for a synchronous standby (running, unseen by the read): the window is inconclusive
    until a read sees it. After a start the core does not know what was delivered
    before it, so tx 11, running at the first read, is doubted too until it ends."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    core.on_event(update(1, 1, tx=10))  # not watched yet: not kept
    started(core)
    fences = [
        xid_fence(9, 12, "9,10,11", 3, {9, 10, 11}),
        xid_fence(10, 12, "10,11", 3, {10, 11}),
        xid_fence(11, 12, "11", 4, {11}),  # tx 10 visible; 11 runs on
    ]
    for fence in fences:
        req = core.next_request()
        assert isinstance(req, ChunkRequest) and req.after_key is None
        core.on_chunk_read(req.id, rows(1, 2), 1.0, fence=fence)
        assert [e for e in expand(core.on_progress(commit(4), commit(4), 0)) if e.op is Op.READ] == []
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.after_key is None
    core.on_chunk_read(req.id, rows(1, 2), 1.0, fence=xid_fence(12, 12, "", 5, set()))
    out = expand(core.on_progress(commit(5), commit(5), 0))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [1, 2]


def test_a_floor_is_held_open_only_by_delivered_transactions_the_read_misses() -> None:
    """``Delivered``/``Floor`` with the primary's fence: once the delivered transactions
    are known (a fence resolved the start), a transaction that runs on but was never
    delivered (tx 11) does not hold a floor open; a delivered one still waiting (tx 10)
    does, until a read sees it; one a read saw is forgotten."""
    delivered = Delivered()
    delivered.prune(xid_fence(9, 9, "", 1, set()))  # nothing ran: resolves the start
    assert not delivered.forgotten
    delivered.add(PgPosition(Lsn(2), 0, None, 9))
    delivered.add(PgPosition(Lsn(3), 0, None, 10))
    floor = Floor.at(PgPosition(Lsn(3)), delivered)
    assert floor.xids == {9, 10}
    waiting = xid_fence(10, 12, "10,11", 4, {10, 11})
    assert not floor.covered_by(waiting)
    narrowed = floor.narrowed(waiting)
    assert narrowed.xids == {10}  # tx 9 was seen
    assert narrowed.covered_by(xid_fence(11, 12, "11", 5, {11}))
    delivered.prune(waiting)
    assert delivered.xids == {10}
    # xids near the 32-bit wrap, from a 64-bit snapshot
    wrapped = Delivered()
    wrapped.prune(xid_fence(5 << 32, 5 << 32, "", 1, set()))
    wrapped.add(PgPosition(Lsn(2), 0, None, (1 << 32) - 1))
    top = (5 << 32) - 1
    assert not Floor.at(PgPosition(Lsn(2)), wrapped).covered_by(
        xid_fence(top, (5 << 32) + 1, str(top), 3, {top}))


def test_after_a_start_every_running_transaction_the_read_misses_is_in_doubt() -> None:
    """The transactions delivered before a start are not known: a read that misses any
    running transaction cannot decide (it may have been delivered before the start);
    the next read decides by those doubted then."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    started(core)
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    core.on_chunk_read(req.id, rows(1), 1.0, fence=xid_fence(7, 8, "7", 3, {7}))
    assert [e for e in expand(core.on_progress(commit(3), commit(3), 0)) if e.op is Op.READ] == []
    again = core.next_request()
    assert isinstance(again, ChunkRequest)
    # tx 7 still runs, tx 8 started since (not doubted before): 8 cannot be the one
    core.on_chunk_read(again.id, rows(1), 1.0, fence=xid_fence(7, 9, "7,8", 4, {7, 8}))
    assert [e for e in expand(core.on_progress(commit(4), commit(4), 0)) if e.op is Op.READ] == []
    third = core.next_request()
    assert isinstance(third, ChunkRequest)
    core.on_chunk_read(third.id, rows(1), 1.0, fence=xid_fence(8, 9, "8", 5, {8}))
    out = expand(core.on_progress(commit(5), commit(5), 0))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [1]


def test_after_a_start_only_committing_transactions_are_in_doubt() -> None:
    """With the running transactions' states known (``PgXidFence.committing``: waiting
    for a synchronous standby), what was delivered before the start is resolved by the
    committing ones the read misses: tx 7 executes a statement (or is prepared and
    left) and holds nothing; tx 8 commits, unseen, and holds the first read; the second
    read sees 8, and 7 (delivered by no one) still does not count."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    started(core)

    def fence(xmax: int, xip: str, end: int, running: set[int], committing: set[int]) -> PgXidFence:
        return PgXidFence.parse(f"7:{xmax}:{xip}", f"0/{end:X}", running, committing)

    for f, end, emitted in ((fence(9, "7,8", 3, {7, 8}, {8}), 3, []),
                            (fence(9, "7", 4, {7}, set()), 4, [1])):
        req = core.next_request()
        assert isinstance(req, ChunkRequest) and req.after_key is None
        core.on_chunk_read(req.id, rows(1), 1.0, fence=f)
        out = expand(core.on_progress(commit(end), commit(end), 0))
        assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == emitted
    floor = Floor(PgPosition(Lsn(2)))  # forgotten: by the committing ones only
    assert fence(9, "7", 4, {7}, set()).covers(floor)
    assert not fence(9, "7,8", 4, {7, 8}, {8}).covers(floor)
    assert not PgXidFence.parse("7:9:7", "0/4", ["7"]).covers(floor)  # states unknown
    known = Floor(PgPosition(Lsn(2)), frozenset({7}), forgotten=False)  # 7 was delivered
    assert not fence(9, "7", 4, {7}, set()).covers(known)


def test_after_a_restart_an_open_transaction_never_delivered_does_not_hold_the_lost_events() -> None:
    """Lost events (held before a restart) are judged by their own
    xids, not by ``xmin``. Tx 5 is idle in transaction (it holds ``xmin`` at 5 for as
    long as it lives) and was never delivered; a read that misses a lost one (tx 11)
    cannot decide, the next, seeing tx 10 and 11 but not 5, does. (Fenced watermark
    windows share this code: tests/integration/test_fence_liveness.py.)"""
    settings = CoreSettings(chunk_size=4, read_only=True, read_ahead=False)
    core = SnapshotCore(settings, instance="a")
    started(core)
    core.on_event(update(1, 3, tx=10))
    core.on_event(update(2, 3, tx=11))
    state = json.loads(json.dumps(core.state()))
    assert state["unsettled"]["xids"] == [10, 11]
    core = SnapshotCore(settings, state, instance="b")
    for fence, end, emitted in ((xid_fence(5, 13, "5,11", 4, set()), 4, []),
                                (xid_fence(5, 13, "5", 5, {5}), 5, [1, 2])):
        req = core.next_request()
        assert isinstance(req, ChunkRequest) and req.after_key is None
        core.on_chunk_read(req.id, rows(1, 2), 1.0, fence=fence)
        out = expand(core.on_progress(commit(end), commit(end), 0))
        assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == emitted


def test_lost_transactions_are_judged_by_their_ids_or_their_range() -> None:
    """``PgXidFence.settles_lost``: by the lost xids; past ``LOST_XIDS`` by their range
    (below ``xmax``, none running inside it); never by an older running transaction."""
    blocker = xid_fence(5, 20, "5", 1, {5})
    assert blocker.settles_lost(Lost(None, 12, {10, 12}, 10))
    assert not xid_fence(5, 20, "5,12", 1, set()).settles_lost(Lost(None, 12, {10, 12}, 10))
    assert not xid_fence(5, 12, "5", 1, set()).settles_lost(Lost(None, 12, {10, 12}, 10))
    ranged = Lost(None, 12, None, 10)  # ids forgotten, range known
    assert blocker.settles_lost(ranged)
    assert not xid_fence(5, 20, "5,11", 1, set()).settles_lost(ranged)
    assert not blocker.settles_lost(Lost(None, 12))  # an old state: by xmin only
    assert not blocker.settles_lost(Lost(None, None))  # an event without a tx id
    many = Lost(xids=set())
    many.add([update(1, 3, tx=t) for t in range(100, 100 + LOST_XIDS + 1)])
    assert many.xids is None and (many.min_tx, many.max_tx) == (100, 100 + LOST_XIDS)
    back = Lost.from_json(json.loads(json.dumps(many.to_json())))
    assert (back.xids, back.min_tx, back.max_tx) == (None, 100, 100 + LOST_XIDS)


def test_a_fence_requested_before_a_floor_or_a_clear_does_not_judge_it() -> None:
    """A fence's running xids were taken when its read ran; a
    transaction that got its xid after that, was delivered, and still waits for a
    synchronous standby is in no doubt set of that fence. Such a fence must not drop a
    floor taken after its request (nor resolve what ``Delivered`` forgot after it)."""
    u = Unsettled()
    u.prune(xid_fence(5, 5, "", 1, set()))  # resolves the start: nothing ran
    issued = u.delivered.epoch  # a read is requested; its running list: none
    u.learn(PgPosition(Lsn(2), 0, None, 20))  # tx 20 delivered, waits for the standby
    u.watch_from(PgPosition(Lsn(2), 0, None, 20))
    late = xid_fence(20, 21, "20", 3, set())  # the read's snapshot misses tx 20
    u.prune(late, issued)
    assert u.floor is not None and u.floor.xids == {20}  # kept: tx 20 is unseen
    u.prune(xid_fence(21, 22, "21", 4, {21}), u.delivered.epoch)  # a later read sees it
    assert u.floor is None
    # The same after Delivered forgot (past its limit): the stale fence resolves nothing.
    d = Delivered(limit=1)
    d.prune(xid_fence(5, 5, "", 1, set()))
    issued = d.epoch
    d.add(PgPosition(Lsn(2), 0, None, 20))
    d.add(PgPosition(Lsn(3), 0, None, 21))  # cleared: 20 forgotten
    d.prune(late, issued)
    assert d.forgotten
    d.prune(xid_fence(20, 22, "20", 4, {20}), d.epoch)  # requested after: resolves
    assert not d.forgotten and d.xids == {20}
