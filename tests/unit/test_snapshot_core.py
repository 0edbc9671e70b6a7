"""The snapshot core's state machine, step by step (no database: the test plays the
runner and the worker)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from pydblog.core import (
    ChunkRequest,
    CoreSettings,
    KeyReadRequest,
    MarkRequest,
    SnapshotCore,
    TableStartRequest,
    parse_signal,
)
from pydblog.core.keys import event_keys, hashable
from pydblog.core.notices import PositionCursor
from pydblog.events import UNCHANGED_TOAST, ChangeEvent, EncodedRow, Op, SnapshotKind, expand
from pydblog.ports import TableInfo
from pydblog.positions import Lsn, PgPosition, Position

TABLES = ["public.t", "public.u", "app.v"]


def info(table: str = "public.t", key: tuple[str, ...] = ("id",)) -> TableInfo:
    schema, name = table.split(".")
    return TableInfo(schema, name, ("id", "v"), ("int", "text"), key)


def pos(lsn: int, index: int = 0) -> PgPosition:
    return PgPosition(Lsn(lsn), index)


def row(k: int, v: str = "x") -> dict[str, Any]:
    return {"id": k, "v": v}



class ExpandingCore(SnapshotCore):
    """The core with its chunk rows expanded into single events (what these tests check)."""

    def on_signal(self, *a: Any, **k: Any) -> list[ChangeEvent]:  # type: ignore[override]
        return list(expand(super().on_signal(*a, **k)))

    def on_signal_error(self, *a: Any, **k: Any) -> list[ChangeEvent]:  # type: ignore[override]
        return list(expand(super().on_signal_error(*a, **k)))

    def on_table_started(self, *a: Any, **k: Any) -> list[ChangeEvent]:  # type: ignore[override]
        return list(expand(super().on_table_started(*a, **k)))

    def on_chunk_read(self, *a: Any, **k: Any) -> list[ChangeEvent]:  # type: ignore[override]
        return list(expand(super().on_chunk_read(*a, **k)))

    def on_request_failed(self, *a: Any, **k: Any) -> list[ChangeEvent]:  # type: ignore[override]
        return list(expand(super().on_request_failed(*a, **k)))

    def on_watermark(self, *a: Any, **k: Any) -> list[ChangeEvent]:  # type: ignore[override]
        return list(expand(super().on_watermark(*a, **k)))


def change(op: Op, k: int, table: str = "public.t", lsn: int = 50, v: str = "new") -> ChangeEvent:
    schema, name = table.split(".")
    after = None if op is Op.DELETE else row(k, v)
    before = row(k, "old") if op is Op.DELETE else None
    return ChangeEvent(op, schema, name, pos(lsn), 0, key={"id": k}, before=before, after=after)


def make(chunk: int = 2, **kw: Any) -> ExpandingCore:
    return ExpandingCore(CoreSettings(chunk_size=chunk, **kw), instance="test")


def execute(core: ExpandingCore, *colls: str, lsn: int = 1, **fields: Any) -> list[ChangeEvent]:
    body = {"data-collections": list(colls), **{k.replace("_", "-"): v for k, v in fields.items()}}
    signal = parse_signal(f"s{lsn}", "execute-snapshot", json.dumps(body))
    return core.on_signal(signal, TABLES, pos(lsn), 1000)


def signal(core: ExpandingCore, type_: str, lsn: int, **fields: Any) -> list[ChangeEvent]:
    body = {k.replace("_", "-"): v for k, v in fields.items()}
    return core.on_signal(parse_signal(f"s{lsn}", type_, json.dumps(body)), TABLES, pos(lsn), 9)


def note(event: ChangeEvent) -> dict[str, Any]:
    assert event.notification is not None
    return event.notification


def data_of(event: ChangeEvent) -> dict[str, Any]:
    data: dict[str, Any] = note(event)["additional_data"]
    return data


def read_ids(events: list[ChangeEvent]) -> list[Any]:
    return [e.after["id"] for e in events if e.op is Op.READ and e.after is not None]


def kinds(events: list[ChangeEvent]) -> list[str]:
    out = []
    for e in events:
        assert e.notification is not None or e.op is Op.READ
        out.append("r" if e.op is Op.READ else str(note(e)["type"]))
    return out


def start_table(
    core: ExpandingCore, lsn: int, max_key: tuple[Any, ...] | None = (5,), **kw: Any
) -> list[ChangeEvent]:
    """Answer the TableStartRequest and deliver its watermark at ``lsn``."""
    req = core.next_request()
    assert isinstance(req, TableStartRequest)
    assert req.watermark is not None
    assert core.on_table_started(req.id, kw.get("info", info(req.table)), max_key) == []
    assert core.next_request() is None  # waiting for the watermark
    return core.on_watermark(req.watermark, pos(lsn), 2000)


def chunk(
    core: ExpandingCore,
    rows: Sequence[dict[str, Any] | EncodedRow],
    lsn: int,
    between: Sequence[ChangeEvent] = (),
    elapsed: float = 1.0,
) -> tuple[ChunkRequest, list[ChangeEvent]]:
    """Run one incremental chunk: L, the events ``between``, the rows, H at ``lsn``."""
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    assert req.low_watermark and req.high_watermark
    assert core.on_watermark(req.low_watermark, pos(lsn - 1), 0) == []
    for e in between:
        core.on_event(e)
    assert core.on_chunk_read(req.id, rows, elapsed) == []
    return req, core.on_watermark(req.high_watermark, pos(lsn), 3000)


# -- the window -------------------------------------------------------------------------


def test_single_table_end_to_end() -> None:
    core = make(chunk=2)
    out = execute(core, "public\\.t")
    assert kinds(out) == ["STARTED"]
    assert out[0].position == pos(1)
    assert out[0].notification == {
        "aggregate_type": "Incremental Snapshot",
        "type": "STARTED",
        "signal_id": "s1",
        "additional_data": {
            "data_collections": ["public.t"],
            "snapshot_type": "incremental",
            "unknown": [],
            "already_queued": [],
        },
    }
    assert core.active and not core.blocking
    started = start_table(core, 10, max_key=(3,))
    assert kinds(started) == ["TABLE_SCAN_STARTED"]
    assert started[0].position == pos(10, 1)
    assert started[0].schema == "public" and started[0].table == "t"

    req, out = chunk(core, [row(1), row(2)], 20)
    assert (req.after_key, req.max_key, req.limit) == (None, (3,), 2)
    assert kinds(out) == ["r", "r", "IN_PROGRESS"]
    assert [e.position for e in out] == [pos(20, 1), pos(20, 2), pos(20, 3)]
    r = out[0]
    assert (r.op, r.before, r.after, r.key, r.snapshot, r.ts_ms) == (
        Op.READ,
        None,
        row(1),
        {"id": 1},
        SnapshotKind.INCREMENTAL,
        3000,
    )
    state = core.state()
    assert state is not None and state["incremental"]["current"]["last_key"] == [2]

    req, out = chunk(core, [row(3)], 30)
    assert req.after_key == (2,)
    assert kinds(out) == ["r", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert out[1].notification is not None
    assert out[1].notification["additional_data"]["total_rows_scanned"] == 3
    assert not core.active
    assert core.state() is None
    assert core.next_request() is None


def test_full_chunk_ending_at_max_key_is_last() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t")
    start_table(core, 10, max_key=(2,))
    _, out = chunk(core, [row(1), row(2)], 20)
    assert kinds(out) == ["r", "r", "TABLE_SCAN_COMPLETED", "COMPLETED"]


def test_every_snapshot_in_a_lane_gets_its_completed() -> None:
    """A table reset by the stream (``restart_table(queue=True)``: queued as ``initial``)
    while a signal's snapshot runs joins the same lane: the signal's COMPLETED comes
    when its own table is done, the reset's when the lane empties (before: one
    COMPLETED, the lane's last job's, and the signal never saw its own)."""
    core = make(chunk=2)
    execute(core, "public\\.t")
    start_table(core, 10, max_key=(2,))
    core.restart_table("public.u", queue=True)
    _, out = chunk(core, [row(1), row(2)], 20)
    assert kinds(out) == ["r", "r", "STARTED", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert [note(e)["signal_id"] for e in out if e.op is not Op.READ] == ["initial", "s1", "s1"]
    assert core.active
    out = start_table(core, 30, max_key=(1,))
    assert kinds(out) == ["TABLE_SCAN_STARTED"]
    _, out = chunk(core, [row(1)], 40)
    assert kinds(out) == ["r", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert note(out[-1])["signal_id"] == "initial"
    assert note(out[-1])["additional_data"] == {"tables": 2, "rows": 3, "chunks": 2}
    assert not core.active


def test_events_between_low_and_high_drop_their_keys() -> None:
    core = make(chunk=5)
    execute(core, "public\\.t")
    start_table(core, 10, max_key=(9,))
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.low_watermark and req.high_watermark
    core.on_event(change(Op.UPDATE, 1))  # before L: ignored
    core.on_watermark(req.low_watermark, pos(19), 0)
    core.on_event(change(Op.UPDATE, 2))  # before the rows arrive
    core.on_event(change(Op.DELETE, 9, table="public.u"))  # other table
    core.on_chunk_read(req.id, [row(k) for k in range(1, 6)], 1.0)
    core.on_event(change(Op.DELETE, 4))  # after the rows arrived
    core.on_event(change(Op.CREATE, 5))
    out = core.on_watermark(req.high_watermark, pos(20), 0)
    assert read_ids(out) == [1, 3]
    core.on_event(change(Op.DELETE, 1))  # after H: rows already out
    state = core.state()
    assert state is not None and state["incremental"]["current"]["last_key"] == [5]


def test_truncate_in_window_clears_chunk_but_advances() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t")
    start_table(core, 10, max_key=(9,))
    trunc = ChangeEvent(Op.TRUNCATE, "public", "t", pos(15), 0)
    _, out = chunk(core, [row(1), row(2)], 20, between=[trunc])
    assert kinds(out) == ["IN_PROGRESS"]
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.after_key == (2,)


def test_key_change_drops_old_and_new_key() -> None:
    core = make(chunk=3)
    execute(core, "public\\.t")
    start_table(core, 10, max_key=(9,))
    moved = ChangeEvent(
        Op.UPDATE, "public", "t", pos(15), 0, key={"id": 3}, before=row(1), after=row(3)
    )
    _, out = chunk(core, [row(1), row(2), row(3)], 20, between=[moved])
    assert read_ids(out) == [2]


def _surrogate_chunking(core: ExpandingCore) -> None:
    execute(core, "public\\.t", surrogate_key="v")
    req0 = core.next_request()
    assert isinstance(req0, TableStartRequest) and req0.surrogate_key == "v"
    core.on_table_started(req0.id, info(key=("v",)), ("z",))
    assert req0.watermark is not None
    core.on_watermark(req0.watermark, pos(10), 0)


def test_surrogate_chunks_drop_rows_by_identity() -> None:
    """Rows sharing a surrogate value are told apart by their event key: a key-only
    delete (REPLICA IDENTITY DEFAULT, no "v") drops exactly its row."""
    core = make(chunk=3)
    _surrogate_chunking(core)
    delete = ChangeEvent(Op.DELETE, "public", "t", pos(15), 0, key={"id": 1})  # no "v"
    req, out = chunk(core, [row(1, "a"), row(2, "a"), row(3, "b")], 20, between=[delete])
    assert req.key_columns == ("v",)
    assert read_ids(out) == [2, 3]


def test_surrogate_chunks_identity_of_encoded_rows() -> None:
    """The same with rows as a fast reader encodes them (identity in key_json), and an
    update whose before image holds the old identity."""
    core = make(chunk=3)
    _surrogate_chunking(core)
    rows = [EncodedRow(("a",), f'{{"id":{i}}}', f'{{"id":{i},"v":"a"}}') for i in (1, 2, 3)]
    update = ChangeEvent(Op.UPDATE, "public", "t", pos(15), 0, key={"id": 9},
                         before={"id": 2, "v": "a"}, after={"id": 9, "v": "a"})
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.low_watermark and req.high_watermark
    core.on_watermark(req.low_watermark, pos(19), 0)
    core.on_event(update)
    core.on_chunk_read(req.id, rows, 1.0)
    out = core.on_watermark(req.high_watermark, pos(20), 0)
    assert read_ids(out) == [1, 3]


def test_event_without_key_makes_surrogate_window_inconclusive_and_rereads() -> None:
    core = make(chunk=2)
    _surrogate_chunking(core)
    keyless = ChangeEvent(Op.DELETE, "public", "t", pos(15), 0)  # no key at all
    req, out = chunk(core, [row(1, "a"), row(2, "b")], 20, between=[keyless])
    assert out == []
    again = core.next_request()
    assert isinstance(again, ChunkRequest) and again.after_key is None
    assert again.low_watermark != req.low_watermark


def test_event_keys_helpers() -> None:
    assert event_keys(change(Op.CREATE, 1), ("id",)) == [(1,)]
    assert event_keys(change(Op.DELETE, 1), ("id",)) == [(1,)]
    bare = ChangeEvent(Op.DELETE, "public", "t", pos(1), 0, key={"id": 4})
    assert event_keys(bare, ("id",)) == [(4,)]
    assert event_keys(bare, ("v",)) is None
    assert hashable({"b": [1, 2], "a": None}) == (("a", None), ("b", (1, 2)))
    ev = ChangeEvent(Op.CREATE, "s", "t", pos(1), 0, after={"k": [1, {"x": 2}]})
    assert event_keys(ev, ("k",)) == [((1, (("x", 2),)),)]


def test_json_list_keys_match() -> None:
    core = make(chunk=3)
    execute(core, "public\\.t")
    start_table(core, 10, max_key=([9, 9],), info=info(key=("id",)))
    ev = ChangeEvent(Op.UPDATE, "public", "t", pos(15), 0, after={"id": [1, 2], "v": "n"})
    _, out = chunk(core, [{"id": [1, 2], "v": "o"}, {"id": [3], "v": "o"}], 20, between=[ev])
    assert [e.after for e in out if e.op is Op.READ] == [{"id": [3], "v": "o"}]


# -- restarts and watermarks ------------------------------------------------------------


def test_unknown_watermarks_are_ignored() -> None:
    core = make()
    assert core.on_watermark("nope", pos(3), 0) == []
    execute(core, "public\\.t")
    assert core.on_watermark("other", pos(4), 0) == []


def test_restart_resumes_after_last_completed_chunk() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t", "public\\.u")
    start_table(core, 10, max_key=(6,))
    chunk(core, [row(1), row(2)], 20)
    interrupted = core.next_request()
    assert isinstance(interrupted, ChunkRequest) and interrupted.low_watermark
    core.on_watermark(interrupted.low_watermark, pos(29), 0)
    core.on_chunk_read(interrupted.id, [row(3), row(4)], 1.0)
    saved = json.loads(json.dumps(core.state()))

    again = ExpandingCore(CoreSettings(chunk_size=2), saved, instance="test2")
    assert again.active
    assert interrupted.high_watermark
    assert again.on_watermark(interrupted.high_watermark, pos(30), 0) == []
    req, out = chunk(again, [row(3), row(4)], 40)
    assert req.after_key == (2,) and req.id != interrupted.id
    assert kinds(out) == ["r", "r", "IN_PROGRESS"]
    assert again.status()["queued"] == ["public.u"]


def test_restart_before_table_start_watermark_starts_again() -> None:
    core = make()
    execute(core, "public\\.t")
    req = core.next_request()
    assert isinstance(req, TableStartRequest)
    core.on_table_started(req.id, info(), (5,))
    again = ExpandingCore(CoreSettings(chunk_size=2), core.state(), instance="b")
    assert req.watermark is not None
    assert again.on_watermark(req.watermark, pos(9), 0) == []
    assert isinstance(again.next_request(), TableStartRequest)


def test_state_is_json_and_round_trips() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t", "app\\.v")
    start_table(core, 10, max_key=(6,))
    chunk(core, [row(1), row(2)], 20)
    signal(core, "pause-snapshot", 21)
    state = core.state()
    text = json.dumps(state)
    again = ExpandingCore(CoreSettings(chunk_size=2), json.loads(text), instance="c")
    assert again.state() == state
    assert again.paused
    assert again.status()["current"]["last_key"] == [2]


def test_state_version_checked() -> None:
    with pytest.raises(ValueError, match="version"):
        SnapshotCore(CoreSettings(), {"version": 99})


# -- signals ------------------------------------------------------------------------------


def test_regexes_unknown_and_duplicates() -> None:
    core = make()
    out = execute(core, "public\\..*", "public\\.t", "nope\\.x")
    data = data_of(out[0])
    assert data["data_collections"] == ["public.t", "public.u"]
    assert data["unknown"] == ["nope\\.x"]
    out = execute(core, "public\\.t", "app\\.v", lsn=2)
    data = data_of(out[0])
    assert data["data_collections"] == ["app.v"] and data["already_queued"] == ["public.t"]
    out = execute(core, "public\\.t", "zzz", lsn=3)
    assert kinds(out) == ["SKIPPED"]
    assert core.status()["queued"] == ["public.t", "public.u", "app.v"]


def test_conditions_and_surrogate_key_reach_requests() -> None:
    core = make()
    execute(
        core,
        "public\\.t",
        additional_conditions=[{"data-collection": "public\\.t", "filter": "v > 'a'"}],
        surrogate_key="v",
    )
    req = core.next_request()
    assert isinstance(req, TableStartRequest)
    assert (req.condition, req.surrogate_key) == ("v > 'a'", "v")
    core.on_table_started(req.id, info(key=("v",)), ("q",))
    assert req.watermark
    core.on_watermark(req.watermark, pos(5), 0)
    chunk_req = core.next_request()
    assert isinstance(chunk_req, ChunkRequest)
    assert (chunk_req.condition, chunk_req.surrogate_key, chunk_req.key_columns) == (
        "v > 'a'",
        "v",
        ("v",),
    )


def test_stop_everything_then_new_snapshot() -> None:
    core = make()
    execute(core, "public\\..*")
    start_table(core, 10)
    inflight = core.next_request()
    assert isinstance(inflight, ChunkRequest) and inflight.low_watermark
    core.on_watermark(inflight.low_watermark, pos(11), 0)
    out = signal(core, "stop-snapshot", 12)
    assert kinds(out) == ["ABORTED"]
    assert data_of(out[0])["data_collections"] == [
        "public.t",
        "public.u",
    ]
    assert not core.active
    state = core.state()  # s1's own ABORTED waits for a position (a mark)
    assert state is not None and [n["type"] for n in state["notices"]] == ["ABORTED"]
    assert core.next_request() is None  # the worker still runs the old chunk
    assert core.on_chunk_read(inflight.id, [row(1)], 1.0) == []
    assert inflight.high_watermark
    assert core.on_watermark(inflight.high_watermark, pos(13), 0) == []
    execute(core, "public\\.t", lsn=14)
    assert isinstance(core.next_request(), TableStartRequest)


def test_stop_one_table_before_and_after_it_started() -> None:
    core = make()
    execute(core, "public\\..*", "app\\.v")
    out = signal(core, "stop-snapshot", 2, data_collections=["public\\.u"])  # queued
    assert data_of(out[0])["data_collections"] == ["public.u"]
    start_table(core, 10)
    out = signal(core, "stop-snapshot", 11, data_collections=["public\\.t"])  # started
    assert kinds(out) == ["ABORTED"]
    req = core.next_request()
    assert isinstance(req, TableStartRequest) and req.table == "app.v"
    out = signal(core, "stop-snapshot", 12, data_collections=["none\\.x"])
    assert kinds(out) == ["SKIPPED"]


def test_pause_and_resume() -> None:
    core = make()
    assert kinds(signal(core, "pause-snapshot", 1)) == ["SKIPPED"]  # nothing to pause
    execute(core, "public\\.t", lsn=2)
    start_table(core, 10)
    inflight = core.next_request()
    assert isinstance(inflight, ChunkRequest)
    assert kinds(signal(core, "pause-snapshot", 11)) == ["PAUSED"]
    assert core.paused and core.status()["paused"]
    # the chunk in flight completes normally
    assert inflight.low_watermark and inflight.high_watermark
    core.on_watermark(inflight.low_watermark, pos(12), 0)
    core.on_chunk_read(inflight.id, [row(1), row(2)], 1.0)
    assert kinds(core.on_watermark(inflight.high_watermark, pos(13), 0)) == [
        "r",
        "r",
        "IN_PROGRESS",
    ]
    assert core.next_request() is None
    assert kinds(signal(core, "resume-snapshot", 14)) == ["RESUMED"]
    assert kinds(signal(core, "resume-snapshot", 15)) == ["SKIPPED"]
    assert isinstance(core.next_request(), ChunkRequest)


def test_signal_error_notification() -> None:
    core = make()
    out = core.on_signal_error("bad", "not JSON", pos(4, 2), 7)
    assert out[0].position == pos(4, 2)
    assert out[0].notification is not None and out[0].notification["type"] == "REJECTED"


# -- table start outcomes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"info": None, "max_key": None}, "does not exist"),
        ({"info": info(key=()), "max_key": (1,)}, "no primary key"),
        ({"info": info(), "max_key": None, "error": "bad filter"}, "bad filter"),
    ],
)
def test_rejected_tables_are_skipped(answer: dict[str, Any], reason: str) -> None:
    core = make()
    execute(core, "public\\.t", "public\\.u")
    req = core.next_request()
    assert isinstance(req, TableStartRequest) and req.watermark
    core.on_table_started(req.id, answer["info"], answer["max_key"], answer.get("error"))
    out = core.on_watermark(req.watermark, pos(10), 0)
    assert kinds(out) == ["REJECTED"]
    assert reason in data_of(out[0])["reason"]
    assert out[0].table == "t"
    nxt = core.next_request()
    assert isinstance(nxt, TableStartRequest) and nxt.table == "public.u"


def test_empty_table_is_done_at_once() -> None:
    core = make()
    execute(core, "public\\.t")
    out = start_table(core, 10, max_key=None)
    assert kinds(out) == ["TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert data_of(out[0])["status"] == "EMPTY"
    assert not core.active


def test_start_initial_places_started_at_first_watermark() -> None:
    core = make()
    assert core.start_initial(TABLES, pos(1), 5) == []
    out = start_table(core, 10)
    assert kinds(out) == ["STARTED", "TABLE_SCAN_STARTED"]
    assert [e.position for e in out] == [pos(10, 1), pos(10, 2)]
    assert note(out[0])["signal_id"] == "initial"


# -- failures -------------------------------------------------------------------------------


def test_retriable_failure_rereads_the_same_chunk() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t")
    start_table(core, 10)
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    assert core.on_request_failed(req.id, "timeout", retriable=True) == []
    again = core.next_request()
    assert isinstance(again, ChunkRequest) and again.after_key == req.after_key


def test_fatal_failure_rejects_table_at_next_watermark() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t")
    start_table(core, 10)
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    core.on_request_failed(req.id, "syntax error", pos(11), 0, retriable=False)
    assert not core.active
    mark = core.next_request()
    assert isinstance(mark, MarkRequest)
    assert core.next_request() is None
    assert core.state() is not None  # the notices wait in the state
    out = core.on_watermark(mark.watermark, pos(12), 0)
    assert kinds(out) == ["REJECTED", "COMPLETED"]
    assert [e.position for e in out] == [pos(12, 1), pos(12, 2)]
    assert core.state() is None


def test_unknown_failures_give_up_after_max_attempts() -> None:
    core = make(chunk=2, max_attempts=2)
    execute(core, "public\\.t")
    start_table(core, 10)
    first = core.next_request()
    assert isinstance(first, ChunkRequest)
    core.on_request_failed(first.id, "boom")
    second = core.next_request()
    assert isinstance(second, ChunkRequest)
    core.on_request_failed(second.id, "boom")
    assert not core.active


def test_mark_superseded_by_new_work() -> None:
    core = make()
    execute(core, "public\\.t")
    req = core.next_request()
    assert isinstance(req, TableStartRequest)
    core.on_request_failed(req.id, "gone", retriable=False)
    assert isinstance(core.next_request(), MarkRequest)
    execute(core, "public\\.u", lsn=2)
    start = core.next_request()
    assert isinstance(start, TableStartRequest)
    core.on_table_started(start.id, info("public.u"), (1,))
    assert start.watermark
    out = core.on_watermark(start.watermark, pos(10), 0)
    assert kinds(out) == ["REJECTED", "COMPLETED", "TABLE_SCAN_STARTED"]


# -- adaptive chunks --------------------------------------------------------------------------


def test_adaptive_chunk_size_grows_and_shrinks_within_bounds() -> None:
    core = make(chunk=4, adaptive=True, time_budget_ms=100, min_chunk=2, max_chunk=8)
    execute(core, "public\\.t")
    start_table(core, 10, max_key=(1000,))
    limits = []
    lsn = 20
    for elapsed in [10.0, 10.0, 10.0, 70.0, 500.0, 500.0, 500.0]:
        req = core.next_request()
        assert isinstance(req, ChunkRequest)
        limits.append(req.limit)
        start = 0 if req.after_key is None else req.after_key[0]
        rows = [row(k) for k in range(start + 1, start + 1 + req.limit)]
        chunk_events(core, req, rows, lsn, elapsed)
        lsn += 10
    assert limits == [4, 8, 8, 8, 8, 4, 2]
    assert core.status()["chunk_size"] == 2


def chunk_events(
    core: ExpandingCore, req: ChunkRequest, rows: list[dict[str, Any]], lsn: int, elapsed: float
) -> list[ChangeEvent]:
    assert req.low_watermark and req.high_watermark
    core.on_watermark(req.low_watermark, pos(lsn - 1), 0)
    core.on_chunk_read(req.id, rows, elapsed)
    return core.on_watermark(req.high_watermark, pos(lsn), 0)


def test_settings_validated() -> None:
    with pytest.raises(ValueError):
        CoreSettings(chunk_size=0)
    with pytest.raises(ValueError):
        CoreSettings(min_chunk=10, max_chunk=5)


# -- blocking ---------------------------------------------------------------------------------


def test_blocking_snapshot_emits_directly_after_the_anchor() -> None:
    core = make(chunk=2)
    out = execute(core, "public\\.t", lsn=5, type="blocking")
    assert kinds(out) == ["STARTED"]
    assert note(out[0])["aggregate_type"] == "Blocking Snapshot"
    assert core.blocking
    assert core.next_request() is None  # the stream is not paused yet
    core.on_stream_paused(pos(4, 3), 777)  # the core has seen (5, 0): the anchor
    req = core.next_request()
    assert isinstance(req, TableStartRequest) and req.watermark is None
    out = core.on_table_started(req.id, info(), (3,))
    assert kinds(out) == ["TABLE_SCAN_STARTED"] and out[0].position == pos(5, 1)
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    assert req.low_watermark is None and req.high_watermark is None and req.blocking
    out = core.on_chunk_read(req.id, [row(1), row(2)], 1.0)
    assert kinds(out) == ["r", "r", "IN_PROGRESS"]
    assert [e.position for e in out] == [pos(5, 2), pos(5, 3), pos(5, 4)]
    assert all(e.snapshot is SnapshotKind.BLOCKING and e.ts_ms == 777 for e in out)
    state = core.state()
    assert state is not None and state["blocking"]["current"]["last_key"] == [2]
    req = core.next_request()
    assert isinstance(req, ChunkRequest) and req.after_key == (2,)
    out = core.on_chunk_read(req.id, [row(3)], 1.0)
    assert kinds(out) == ["r", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert out[0].position == pos(5, 5)
    assert not core.blocking and not core.active


def test_blocking_restart_anchors_at_saved_horizon() -> None:
    core = make(chunk=1)
    execute(core, "public\\.t", lsn=5, type="blocking")
    core.on_stream_paused(None, 0)
    req = core.next_request()
    assert isinstance(req, TableStartRequest)
    core.on_table_started(req.id, info(), (3,))
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    out = core.on_chunk_read(req.id, [row(1)], 1.0)
    last = out[-1].position
    again = ExpandingCore(CoreSettings(chunk_size=1), core.state(), instance="z")
    assert again.blocking
    again.on_stream_paused(pos(5, 0), 0)  # an older checkpoint position
    req = again.next_request()
    assert isinstance(req, ChunkRequest) and req.after_key == (1,)
    out = again.on_chunk_read(req.id, [row(2)], 1.0)
    assert out[0].position > last


def test_blocking_goes_before_incremental_and_pause_does_not_stop_it() -> None:
    core = make(chunk=5)
    execute(core, "public\\.t", lsn=1)
    start_table(core, 10)
    execute(core, "public\\.u", "public\\.t", lsn=11, type="blocking")  # t already queued
    assert core.status()["queued"] == ["public.u"]
    signal(core, "pause-snapshot", 12)
    core.on_stream_paused(pos(12), 0)
    req = core.next_request()
    assert isinstance(req, TableStartRequest) and req.table == "public.u"
    core.on_table_started(req.id, info("public.u"), None)
    assert not core.blocking
    assert core.next_request() is None  # incremental lane paused


def test_no_window_event_is_cheap_noop() -> None:
    core = make()
    core.on_event(change(Op.UPDATE, 1))
    assert core.state() is None and core.status()["active"] is False


def test_position_cursor() -> None:
    base: Position = pos(7, 4)
    cur = PositionCursor(base, 1)
    assert [cur.next(), cur.next()] == [pos(7, 5), pos(7, 6)]


def test_status_percent() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t", "public\\.u")
    start_table(core, 10, max_key=(4,))
    chunk(core, [row(1), row(2)], 20)
    status = core.status()
    assert status["percent"] == 25.0
    assert status["current"]["table"] == "public.t"
    assert (status["chunks_done"], status["rows"], status["tables_total"]) == (1, 2, 2)


def test_rows_without_key_columns_reject_the_table() -> None:
    core = make(chunk=2)
    execute(core, "public\\.t")
    start_table(core, 10)
    req = core.next_request()
    assert isinstance(req, ChunkRequest)
    assert core.on_chunk_read(req.id, [{"v": "no id"}], 1.0) == []
    assert not core.active
    mark = core.next_request()
    assert isinstance(mark, MarkRequest)
    out = core.on_watermark(mark.watermark, pos(30), 0)
    assert kinds(out) == ["REJECTED", "COMPLETED"]
    assert "key column" in data_of(out[0])["reason"]


def test_null_and_composite_keys_match_by_equality() -> None:
    core = make(chunk=3)
    execute(core, "public\\.t", surrogate_key="v")
    start_table(core, 10, max_key=(None, 9), info=info(key=("v", "id")))
    rows: list[dict[str, Any]] = [{"id": 1, "v": None}, {"id": 2, "v": None}, {"id": 3, "v": "a"}]
    touched = ChangeEvent(Op.UPDATE, "public", "t", pos(15), 0, key={"id": 2}, after={"id": 2, "v": None})
    _, out = chunk(core, rows, 20, between=[touched])
    assert [e.key for e in out if e.op is Op.READ] == [{"v": None, "id": 1}, {"v": "a", "id": 3}]
    state = core.state()
    assert state is not None and state["incremental"]["current"]["last_key"] == ["a", 3]


def test_window_drops_encoded_rows_with_scalar_and_list_keys() -> None:
    """Encoded rows are matched by their raw key when it is hashable as is, else by its
    match key (a JSON list or object in the key)."""
    from pydblog.core.window import ChunkWindow

    for keys, touched in (([1, 2, 3], 2), ([[1], [2], [3]], [2]), ([{"a": 1}, {"a": 2}], {"a": 2})):
        rows = [EncodedRow((k,), "{}", "{}") for k in keys]
        w = ChunkWindow("public", "t", ("id",))
        w.observe(change(Op.UPDATE, 0)._replace(key={"id": touched}, after={"id": touched}))
        w.set_rows(rows)
        kept = [r.chunk_key[0] for r in w.close().rows if isinstance(r, EncodedRow)]
        assert kept == [k for k in keys if k != touched]


def test_identity_is_persisted_and_keys_rows_after_restart() -> None:
    """The row identity is decided once, at the table's start, and kept in the state:
    after a restart the chunk requests still name it and rows are keyed by it (never by
    the surrogate key that orders the chunks)."""
    core = make(chunk=2)
    execute(core, "public\\.t", surrogate_key="v")
    req0 = core.next_request()
    assert isinstance(req0, TableStartRequest) and req0.watermark is not None
    core.on_table_started(req0.id, TableInfo("public", "t", ("id", "v"), ("int", "text"),
                                             ("v",), ("id",)), ("z",))
    core.on_watermark(req0.watermark, pos(10), 0)
    saved = json.loads(json.dumps(core.state()))
    assert saved["incremental"]["current"]["identity"] == ["id"]
    again = ExpandingCore(CoreSettings(chunk_size=2), saved, instance="r")
    req, out = chunk(again, [row(1, "a"), row(2, "b")], 20)
    assert req.identity == ("id",) and req.key_columns == ("v",)
    assert [e.key for e in out if e.op is Op.READ] == [{"id": 1}, {"id": 2}]


def test_identity_index_beside_primary_key_windows_by_identity() -> None:
    """Chunked by the primary key ``id`` while the identity is another column ``v``
    (REPLICA IDENTITY USING INDEX): a key-only delete naming only ``v`` drops its row
    from the window (it used to be missed, and the deleted row was resurrected)."""
    core = make(chunk=3)
    execute(core, "public\\.t")
    req0 = core.next_request()
    assert isinstance(req0, TableStartRequest) and req0.watermark is not None
    core.on_table_started(req0.id, TableInfo("public", "t", ("id", "v"), ("int", "text"),
                                             ("id",), ("v",)), (9,))
    core.on_watermark(req0.watermark, pos(10), 0)
    delete = ChangeEvent(Op.DELETE, "public", "t", pos(15), 0, key={"v": "b"},
                         before={"id": None, "v": "b"})
    rows = [EncodedRow((i,), f'{{"v":"{v}"}}', f'{{"id":{i},"v":"{v}"}}')
            for i, v in ((1, "a"), (2, "b"), (3, "c"))]
    req, out = chunk(core, rows, 20, between=[delete])
    assert req.identity == ("v",)
    assert read_ids(out) == [1, 3]
    assert [e.key for e in out if e.op is Op.READ] == [{"v": "a"}, {"v": "c"}]


def test_key_change_create_with_unchanged_columns_is_reread_until_a_full_row_lands() -> None:
    """The create of a key change carrying unchanged (TOAST) columns queues a key
    re-read; the queue survives a restart; a re-read whose row is dropped by another
    partial update is queued again; the full row lands at the H of the next one."""
    core = make()
    partial = {"id": 7, "v": UNCHANGED_TOAST}
    core.on_event(ChangeEvent(Op.CREATE, "public", "t", pos(5), 0, key={"id": 7},
                              after=partial, unchanged=("v",)))
    assert core.active and core.status()["rereads_queued"] == 1
    again = ExpandingCore(CoreSettings(chunk_size=2), json.loads(json.dumps(core.state())),
                          instance="k")
    req = again.next_request()
    assert isinstance(req, KeyReadRequest) and req.keys == ((7,),) and req.identity == ("id",)
    again.on_watermark(req.low_watermark, pos(9), 0)
    again.on_event(ChangeEvent(Op.UPDATE, "public", "t", pos(10), 0, key={"id": 7},
                               after=partial, unchanged=("v",)))
    again.on_chunk_read(req.id, [row(7, "full")], 1.0)
    assert again.on_watermark(req.high_watermark, pos(11), 0) == []
    req2 = again.next_request()
    assert isinstance(req2, KeyReadRequest) and req2.keys == ((7,),)
    again.on_watermark(req2.low_watermark, pos(19), 0)
    again.on_chunk_read(req2.id, [row(7, "full")], 1.0)
    out = again.on_watermark(req2.high_watermark, pos(20), 0)
    assert [(e.op, e.key, e.after) for e in out] == [(Op.READ, {"id": 7}, row(7, "full"))]
    assert not again.active and again.state() is None


def test_surrogate_key_snapshot_ends_only_at_an_empty_range_or_max_key() -> None:
    """A short surrogate-key chunk (a NULL group, a group re-read shortened by deletes)
    below ``max_key`` is not the end: one more chunk is read, and only an empty one
    (the database has nothing left in the range) completes the table."""
    core = make(chunk=3)
    _surrogate_chunking(core)  # max key ("z",)
    _, out = chunk(core, [{"id": 1, "v": None}], 20)
    assert kinds(out) == ["r", "IN_PROGRESS"]
    req, out = chunk(core, [row(2, "b")], 30)
    assert req.after_key == (None,) and kinds(out) == ["r", "IN_PROGRESS"]
    req, out = chunk(core, [], 40)
    assert req.after_key == ("b",)
    assert kinds(out) == ["TABLE_SCAN_COMPLETED", "COMPLETED"]
