"""Concurrent windows (``core.flight``), step by step: several chunks of one table in
flight, each with its own L/H, emitted in key order."""

from __future__ import annotations

from typing import Any

from pydblog.core import BoundsRequest, ChunkRequest, CoreSettings, TableStartRequest
from pydblog.events import ChangeEvent, Op
from tests.unit.test_snapshot_core import ExpandingCore, change, execute, info, make, pos, row


def started(parallelism: int = 2, chunk: int = 2, max_key: int = 8) -> ExpandingCore:
    core = make(chunk, parallelism=parallelism)
    execute(core, "public\\.t")
    start = core.next_request()
    assert isinstance(start, TableStartRequest) and start.watermark is not None
    core.on_table_started(start.id, info(), (max_key,))
    core.on_watermark(start.watermark, pos(2), 1000)
    return core


def bounds(core: ExpandingCore, keys: list[int]) -> BoundsRequest:
    request = core.next_request()
    assert isinstance(request, BoundsRequest)
    assert request.step == 2 and request.max_key == (8,)
    core.on_bounds(request.id, [(k,) for k in keys])
    return request


def chunk(core: ExpandingCore) -> ChunkRequest:
    request = core.next_request()
    assert isinstance(request, ChunkRequest) and request.concurrent
    assert request.low_watermark is not None and request.high_watermark is not None
    return request


def ids(events: list[ChangeEvent]) -> list[Any]:
    return [e.after["id"] for e in events if e.op is Op.READ and e.after is not None]


def last_key(core: ExpandingCore) -> Any:
    state = core.state()
    assert state is not None
    return state["incremental"]["current"]["last_key"]


def test_windows_overlap_and_are_emitted_in_key_order() -> None:
    core = started()
    b = bounds(core, [2, 4, 6, 8])
    assert b.after_key is None and b.count == 4
    r1, r2 = chunk(core), chunk(core)
    assert (r1.after_key, r1.max_key, r2.after_key, r2.max_key) == (None, (2,), (2,), (4,))
    assert core.next_request() is None  # two reads at once: the limit
    core.on_watermark(r1.low_watermark or "", pos(3), 1000)
    core.on_watermark(r2.low_watermark or "", pos(4), 1000)
    core.on_chunk_read(r2.id, [row(3), row(4)], 1.0)
    assert core.on_watermark(r2.high_watermark or "", pos(5), 1000) == []  # r1 still open
    assert last_key(core) is None
    # After r2's H, its window stays open until it is emitted: this update is newer
    # than the row r2 read, and r2's rows land after it.
    core.on_event(change(Op.UPDATE, 3, lsn=6))
    core.on_event(change(Op.UPDATE, 1, lsn=6))  # before r1's H: drops 1 from r1
    core.on_chunk_read(r1.id, [row(1), row(2)], 1.0)
    out = core.on_watermark(r1.high_watermark or "", pos(7), 1000)
    assert ids(out) == [2, 4]
    positions = [e.position for e in out]
    assert positions == sorted(positions) and all(p > pos(7) for p in positions)
    assert last_key(core) == [4]


def test_an_event_drops_a_key_only_from_the_window_whose_rows_hold_it() -> None:
    core = started()
    bounds(core, [2, 4, 6, 8])
    r1, r2 = chunk(core), chunk(core)
    for n, r in enumerate((r1, r2)):
        core.on_watermark(r.low_watermark or "", pos(3 + n), 1000)
    core.on_event(change(Op.UPDATE, 2, lsn=5))  # in r1's range only
    core.on_chunk_read(r1.id, [row(1), row(2)], 1.0)
    core.on_chunk_read(r2.id, [row(3), row(4)], 1.0)
    out = core.on_watermark(r1.high_watermark or "", pos(6), 1000)
    assert ids(out) == [1]
    out = core.on_watermark(r2.high_watermark or "", pos(7), 1000)
    assert ids(out) == [3, 4]


def test_a_full_range_continues_before_later_ranges() -> None:
    """Rows inserted into a range after its bounds: the range is read up to its limit,
    emitted, and its rest read next; the later range waits."""
    core = started()
    bounds(core, [4, 8])  # stale: 2 rows per range expected
    r1, r2 = chunk(core), chunk(core)
    assert r1.max_key == (4,) and r2.max_key == (8,)
    for n, r in enumerate((r1, r2)):
        core.on_watermark(r.low_watermark or "", pos(3 + n), 1000)
    core.on_chunk_read(r2.id, [row(5), row(6)], 1.0)
    core.on_watermark(r2.high_watermark or "", pos(5), 1000)
    core.on_chunk_read(r1.id, [row(1), row(2)], 1.0)  # full: (2, 4] is still unread
    out = core.on_watermark(r1.high_watermark or "", pos(6), 1000)
    assert ids(out) == [1, 2] and last_key(core) == [2]
    rest = chunk(core)
    assert (rest.after_key, rest.max_key) == ((2,), (4,))
    core.on_watermark(rest.low_watermark or "", pos(7), 1000)
    core.on_chunk_read(rest.id, [row(3)], 1.0)
    out = core.on_watermark(rest.high_watermark or "", pos(8), 1000)
    assert ids(out) == [3, 5, 6] and last_key(core) == [6]


def test_failure_and_inconclusive_window_read_the_range_again() -> None:
    core = started()
    bounds(core, [2, 4, 6, 8])
    r1, r2 = chunk(core), chunk(core)
    core.on_request_failed(r1.id, "boom", retriable=True)
    again = chunk(core)
    assert (again.after_key, again.max_key) == (None, (2,)) and again.id != r1.id
    for n, r in enumerate((again, r2)):
        core.on_watermark(r.low_watermark or "", pos(3 + n), 1000)
    # No key: the window cannot decide, so the range is read again.
    core.on_event(ChangeEvent(Op.UPDATE, "public", "t", pos(5), 0, key=None, after={"v": "x"}))
    core.on_chunk_read(again.id, [row(1), row(2)], 1.0)
    core.on_chunk_read(r2.id, [row(3), row(4)], 1.0)
    assert ids(core.on_watermark(again.high_watermark or "", pos(6), 1000)) == []
    assert last_key(core) is None
    third = chunk(core)
    assert third.after_key is None and third.max_key == (2,)


def test_last_range_ends_the_table_and_restart_resumes_after_the_emitted_prefix() -> None:
    core = started(max_key=4)
    request = core.next_request()
    assert isinstance(request, BoundsRequest)
    core.on_bounds(request.id, [(2,)])  # fewer than asked: (2, 4] is the last range
    r1, r2 = chunk(core), chunk(core)
    assert r2.max_key == (4,)
    for n, r in enumerate((r1, r2)):
        core.on_watermark(r.low_watermark or "", pos(3 + n), 1000)
    core.on_chunk_read(r1.id, [row(1), row(2)], 1.0)
    core.on_watermark(r1.high_watermark or "", pos(5), 1000)
    saved = core.state()
    assert saved is not None and saved["incremental"]["current"]["last_key"] == [2]
    core.on_chunk_read(r2.id, [row(3)], 1.0)
    out = core.on_watermark(r2.high_watermark or "", pos(6), 1000)
    kinds = [e.notification["type"] for e in out if e.notification is not None]
    assert ids(out) == [3] and "TABLE_SCAN_COMPLETED" in kinds and "COMPLETED" in kinds
    # A restart from the state saved after r1 plans bounds after key 2 again.
    restored = ExpandingCore(CoreSettings(chunk_size=2, parallelism=2), saved, instance="again")
    request = restored.next_request()
    assert isinstance(request, BoundsRequest) and request.after_key == (2,)


# -- several tables in flight (the tail of one table and the next ones) -----------------


def _start(core: ExpandingCore, table: str, lsn: int, max_key: int = 4) -> None:
    start = core.next_request()
    assert isinstance(start, TableStartRequest) and start.concurrent and start.table == table
    assert start.watermark is not None
    core.on_table_started(start.id, info(table), (max_key,))
    core.on_watermark(start.watermark, pos(lsn), 1000)


def _bounds(core: ExpandingCore, table: str, keys: list[int]) -> None:
    request = core.next_request()
    assert isinstance(request, BoundsRequest) and request.table == table
    core.on_bounds(request.id, [(k,) for k in keys])


def test_the_next_table_starts_once_the_current_one_has_no_chunk_left_to_start() -> None:
    core = make(2, parallelism=3)
    execute(core, "public\\.t", "public\\.u")
    _start(core, "public.t", 2)
    _bounds(core, "public.t", [2])  # t: (None, 2], (2, 4]: the rest fits one more range
    t1, t2 = chunk(core), chunk(core)
    assert (t1.table, t2.table, t2.max_key) == ("public.t", "public.t", (4,))
    # Every chunk of t is started: u starts beside them, on the third connection.
    _start(core, "public.u", 3)
    assert core.status()["in_flight"] == ["public.t", "public.u"]
    _bounds(core, "public.u", [2])
    u1 = chunk(core)
    assert (u1.table, u1.after_key, u1.max_key) == ("public.u", None, (2,))
    assert core.next_request() is None  # three reads at once: the limit
    for n, r in enumerate((t1, t2, u1)):
        core.on_watermark(r.low_watermark or "", pos(4 + n), 1000)
    core.on_chunk_read(t2.id, [row(3), row(4)], 1.0)
    u2 = chunk(core)  # t2's read is done: a connection is free
    assert (u2.table, u2.after_key) == ("public.u", (2,))
    # A write to key 1 of u drops it from u's window only (t's range 1 holds key 1 too).
    core.on_event(change(Op.UPDATE, 1, table="public.u", lsn=7))
    core.on_chunk_read(u1.id, [row(1), row(2)], 1.0)
    core.on_chunk_read(t1.id, [row(1), row(2)], 1.0)
    out = core.on_watermark(u1.high_watermark or "", pos(8), 1000)
    assert [(e.table, e.after["id"]) for e in out if e.op is Op.READ and e.after] == [("u", 2)]
    state = core.state()
    assert state is not None  # u's progress persisted beside t's: t current, u queued first
    assert state["incremental"]["current"]["table"] == "public.t"
    assert state["incremental"]["current"]["last_key"] is None
    assert [(j["table"], j["last_key"]) for j in state["incremental"]["queue"]] == [
        ("public.u", [2])
    ]
    # A restart now resumes both tables where their emitted prefixes end.
    again = ExpandingCore(CoreSettings(chunk_size=2, parallelism=3), state, instance="again")
    _bounds(again, "public.t", [2])
    assert (chunk(again).after_key, chunk(again).after_key) == (None, (2,))
    _bounds(again, "public.u", [])
    assert chunk(again).after_key == (2,)


def test_tables_complete_in_any_order_and_the_lane_completes_last() -> None:
    core = make(2, parallelism=2)
    execute(core, "public\\.t", "public\\.u")
    _start(core, "public.t", 2)
    _bounds(core, "public.t", [])  # t: one range, (None, 4]
    t1 = chunk(core)
    _start(core, "public.u", 3)
    _bounds(core, "public.u", [])
    u1 = chunk(core)
    for n, r in enumerate((t1, u1)):
        core.on_watermark(r.low_watermark or "", pos(4 + n), 1000)
    core.on_chunk_read(u1.id, [row(1)], 1.0)  # short reads: each table's last range
    core.on_chunk_read(t1.id, [row(3)], 1.0)
    out = core.on_watermark(u1.high_watermark or "", pos(6), 1000)
    types = [str(e.notification["type"]) for e in out if e.notification]
    assert types == ["TABLE_SCAN_COMPLETED"] and out[-1].table == "u"
    assert core.active and core.status()["in_flight"] == ["public.t"]
    out = core.on_watermark(t1.high_watermark or "", pos(7), 1000)
    types = [str(e.notification["type"]) for e in out if e.notification]
    assert types == ["TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert not core.active


def test_failures_count_per_table() -> None:
    """Unknown failures give a table up after ``max_attempts`` consecutive failures of
    its own requests: another table's failures do not count against it, and another
    table's progress does not reset it."""
    core = make(2, parallelism=3, max_attempts=3)
    execute(core, "public\\.t", "public\\.u")
    _start(core, "public.t", 2)
    _bounds(core, "public.t", [2])
    t1, t2 = chunk(core), chunk(core)
    _start(core, "public.u", 3)
    _bounds(core, "public.u", [2])
    u1 = chunk(core)
    core.on_request_failed(t1.id, "boom")
    core.on_request_failed(t2.id, "boom")
    core.on_request_failed(u1.id, "boom")  # u's first failure: u keeps going
    assert core.status()["in_flight"] == ["public.t", "public.u"]
    again = [r for r in (core.next_request(), core.next_request()) if r is not None]
    assert again and all(isinstance(r, ChunkRequest) for r in again)
    for r in again:  # t's third consecutive failure gives t up, not u
        if isinstance(r, ChunkRequest) and r.table == "public.t":
            core.on_request_failed(r.id, "boom")
            break
    assert core.status()["in_flight"] == ["public.u"]


# -- integer keys: ranges cut by arithmetic (core.intsplit) ------------------------------


def _read(core: ExpandingCore, r: ChunkRequest, keys: list[int], lsn: int) -> list[ChangeEvent]:
    core.on_watermark(r.low_watermark or "", pos(lsn), 1000)
    core.on_chunk_read(r.id, [row(k) for k in keys], 1.0)
    return core.on_watermark(r.high_watermark or "", pos(lsn + 1), 1000)


def test_integer_keys_are_cut_by_arithmetic_after_the_first_bounds() -> None:
    """After one bounds query that says the key is an integer, no more bounds queries:
    the next ranges are as wide as the measured density says ``chunk_size`` rows take,
    each read with LIMIT 1.5 x that."""
    core = started(max_key=100)
    request = core.next_request()
    assert isinstance(request, BoundsRequest)
    core.on_bounds(request.id, [(10,), (20,), (30,), (40,)], integer=True)  # 0.2 rows/key
    lsn = 10
    for _ in range(2):
        r1, r2 = chunk(core), chunk(core)
        _read(core, r1, [r1.max_key[0] - 5, r1.max_key[0]], lsn)
        _read(core, r2, [r2.max_key[0] - 5, r2.max_key[0]], lsn + 2)
        lsn += 4
    assert last_key(core) == [40]
    a1, a2 = chunk(core), chunk(core)  # no BoundsRequest in between
    assert (a1.after_key, a1.max_key, a1.limit) == ((40,), (50,), 3)
    assert (a2.after_key, a2.max_key, a2.limit) == ((50,), (60,), 3)


def test_an_integer_range_that_fills_its_limit_is_cut_again_at_once() -> None:
    """A dense region: the read fills its LIMIT at key 43 of (40, 50]: the range covers
    (40, 43] only and its rest is cut at the density just measured, read next (before
    the ranges planned after it), and no key is skipped or read twice."""
    core = started(max_key=60)
    request = core.next_request()
    assert isinstance(request, BoundsRequest)
    core.on_bounds(request.id, [(10,), (20,), (30,), (40,)], integer=True)
    lsn = 10
    for _ in range(2):
        r1, r2 = chunk(core), chunk(core)
        _read(core, r1, [r1.max_key[0] - 5, r1.max_key[0]], lsn)
        _read(core, r2, [r2.max_key[0] - 5, r2.max_key[0]], lsn + 2)
        lsn += 4
    a1, a2 = chunk(core), chunk(core)
    assert (a1.after_key, a1.max_key, a2.after_key, a2.max_key) == ((40,), (50,), (50,), (60,))
    out = _read(core, a1, [41, 42, 43], 30)  # full: 3 rows in 3 keys
    assert ids(out) == [41, 42, 43] and last_key(core) == [43]
    nxt = chunk(core)  # the rest of (40, 50], at 1 row per key: 2 keys wide
    assert (nxt.after_key, nxt.max_key) == ((43,), (45,))
    _read(core, a2, [55, 60], 40)  # a2 waits behind the rest
    assert last_key(core) == [43]
    out = _read(core, nxt, [44, 45], 50)
    assert ids(out) == [44, 45] and last_key(core) == [45]
    seen = [44, 45]
    while (r := core.next_request()) is not None:
        assert isinstance(r, ChunkRequest) and r.after_key is not None
        keys = [k for k in range(r.after_key[0] + 1, r.max_key[0] + 1) if k <= 50][: r.limit]
        out = _read(core, r, keys, 60 + len(seen))
        seen += ids(out)
    assert seen == [44, 45, 46, 47, 48, 49, 50, 55, 60]
