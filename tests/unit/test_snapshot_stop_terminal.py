"""A stop-snapshot never leaves another snapshot without its end.

Every execute-snapshot (and the ``initial`` snapshot) ends with exactly one terminal
notification under its own signal id: ABORTED when a stop removed its last remaining
tables, else COMPLETED (listing the tables a stop removed, if any). Before, the stop's
ABORTED carried only the stop's id, and a snapshot whose remaining tables it removed got
neither: ``dblog snapshot --wait <id>`` waited forever."""

from __future__ import annotations

import json
from typing import Any

from pydblog.core import CoreSettings, MarkRequest
from pydblog.events import ChangeEvent, Op
from tests.unit.test_snapshot_core import (
    ExpandingCore,
    chunk,
    execute,
    kinds,
    make,
    note,
    pos,
    row,
    signal,
    start_table,
)

TERMINAL = ("COMPLETED", "ABORTED")


def notes(events: list[ChangeEvent]) -> list[tuple[str, str]]:
    return [(note(e)["type"], note(e)["signal_id"]) for e in events if e.op is not Op.READ]


def terminals(events: list[ChangeEvent], signal_id: str) -> list[dict[str, Any]]:
    return [note(e) for e in events
            if e.op is not Op.READ and note(e)["signal_id"] == signal_id
            and note(e)["type"] in TERMINAL]


def place_waiting(core: ExpandingCore, lsn: int) -> list[ChangeEvent]:
    """The watermark the core asks for to place notices waiting for a position."""
    req = core.next_request()
    assert isinstance(req, MarkRequest), req
    return core.on_watermark(req.watermark, pos(lsn), 5000)


def make_restored(state: dict[str, Any]) -> ExpandingCore:
    return ExpandingCore(CoreSettings(chunk_size=2), state, instance="again")


def test_stop_of_a_signals_remaining_table_aborts_that_signal() -> None:
    """s1 covers t and u; t is done; a stop of u ends s1 (ABORTED
    under s1, naming u and the stop)."""
    core = make(chunk=2)
    log = execute(core, "public\\.t", "public\\.u")
    log += start_table(core, 10, max_key=(1,))
    _, out = chunk(core, [row(1)], 20)
    log += out
    assert kinds(out) == ["r", "TABLE_SCAN_COMPLETED"]  # s1 still has u
    out = signal(core, "stop-snapshot", 30, data_collections=["public\\.u"])
    assert notes(out) == [("ABORTED", "s30")]  # the stop's own, at its position
    assert not core.active
    log += out + place_waiting(core, 31)
    assert terminals(log, "s1") == [{
        "aggregate_type": "Incremental Snapshot", "type": "ABORTED", "signal_id": "s1",
        "additional_data": {"data_collections": ["public.u"], "stopped_by": "s30"},
    }]
    assert core.state() is None and core.next_request() is None


def test_stop_all_ends_every_signal_once() -> None:
    """A stop without data-collections while two signals and a stream reset
    (``initial``) share the lane: one ABORTED each, under its own id."""
    core = make(chunk=2)
    log = execute(core, "public\\.t") + execute(core, "public\\.u", lsn=2)
    core.restart_table("app.v", queue=True)
    log += start_table(core, 10, max_key=(9,))
    _, out = chunk(core, [row(1), row(2)], 20)
    log += out
    log += signal(core, "stop-snapshot", 30)
    log += place_waiting(core, 31)
    for sid, tables in (("s1", ["public.t"]), ("s2", ["public.u"]), ("initial", ["app.v"])):
        ends = terminals(log, sid)
        assert [n["type"] for n in ends] == ["ABORTED"], (sid, notes(log))
        assert ends[0]["additional_data"]["data_collections"] == tables
    assert notes(log).index(("STARTED", "initial")) < notes(log).index(("ABORTED", "initial"))


def test_stop_of_some_tables_then_completed_lists_them() -> None:
    """s1 keeps a table: it goes on, and its one COMPLETED lists what the stop removed;
    a later stop of its last table: its ABORTED lists every table stopped of it."""
    core = make(chunk=2)
    log = execute(core, "public\\.t", "public\\.u", "app\\.v")
    log += signal(core, "stop-snapshot", 2, data_collections=["public\\.u"])
    log += start_table(core, 10, max_key=(1,))
    _, out = chunk(core, [row(1)], 20)
    log += out
    log += start_table(core, 30, max_key=(1,))
    _, out = chunk(core, [row(1)], 40)
    log += out
    ends = terminals(log, "s1")
    assert [n["type"] for n in ends] == ["COMPLETED"]
    assert ends[0]["additional_data"]["aborted_data_collections"] == ["public.u"]

    core = make(chunk=2)
    log = execute(core, "public\\.t", "public\\.u", "app\\.v")
    log += start_table(core, 10, max_key=(1,))
    log += signal(core, "stop-snapshot", 11, data_collections=["public\\.u"])
    _, out = chunk(core, [row(1)], 20)
    log += out
    assert terminals(log, "s1") == [] and core.active
    log += signal(core, "stop-snapshot", 21, data_collections=["app\\.v"])
    log += place_waiting(core, 22)
    ends = terminals(log, "s1")
    assert [n["type"] for n in ends] == ["ABORTED"]
    assert ends[0]["additional_data"] == {
        "data_collections": ["public.u", "app.v"], "stopped_by": "s21"}


def test_pause_then_stop_and_resume() -> None:
    """Paused: a stop of everything still places the ABORTED (a mark is not a chunk);
    a partial stop while paused, then resume: the COMPLETED lists the stopped table."""
    core = make(chunk=2)
    log = execute(core, "public\\.t", "public\\.u")
    log += start_table(core, 10, max_key=(9,))
    log += signal(core, "pause-snapshot", 11)
    log += signal(core, "stop-snapshot", 12)
    log += place_waiting(core, 13)
    assert [n["type"] for n in terminals(log, "s1")] == ["ABORTED"]
    assert not core.paused

    core = make(chunk=2)
    log = execute(core, "public\\.t", "public\\.u")
    log += start_table(core, 10, max_key=(1,))
    log += signal(core, "pause-snapshot", 11)
    log += signal(core, "stop-snapshot", 12, data_collections=["public\\.u"])
    assert core.next_request() is None and core.paused
    log += signal(core, "resume-snapshot", 13)
    _, out = chunk(core, [row(1)], 20)
    log += out
    ends = terminals(log, "s1")
    assert [n["type"] for n in ends] == ["COMPLETED"]
    assert ends[0]["additional_data"]["aborted_data_collections"] == ["public.u"]


def test_stop_ends_survive_a_restart() -> None:
    """From the persisted state: an ABORTED not placed yet is placed after the restart;
    the tables stopped of a signal still running are in its COMPLETED after it."""
    core = make(chunk=2)
    log = execute(core, "public\\.t", "public\\.u")
    log += start_table(core, 10, max_key=(1,))
    _, out = chunk(core, [row(1)], 20)
    log += out + signal(core, "stop-snapshot", 30, data_collections=["public\\.u"])
    state = core.state()
    assert state is not None  # the ABORTED waits for a position: persisted
    core = make_restored(json.loads(json.dumps(state)))
    log += place_waiting(core, 31)
    assert [n["type"] for n in terminals(log, "s1")] == ["ABORTED"]

    core = make(chunk=2)
    log = execute(core, "public\\.t", "public\\.u")
    log += start_table(core, 10, max_key=(1,))
    log += signal(core, "stop-snapshot", 11, data_collections=["public\\.u"])
    state = core.state()
    assert state is not None
    core = make_restored(json.loads(json.dumps(state)))
    _, out = chunk(core, [row(1)], 30)  # t's first chunk, from its persisted start
    log += out
    ends = terminals(log, "s1")
    assert [n["type"] for n in ends] == ["COMPLETED"]
    assert ends[0]["additional_data"]["aborted_data_collections"] == ["public.u"]
    assert not core.active and core.state() is None


def test_a_stopped_table_queued_again_under_initial_is_not_listed_as_aborted() -> None:
    """Two re-created tables queued as ``initial``; a stop removes one, the stream then
    resets it again (queued under ``initial`` once more) and it is read: ``initial``'s
    one COMPLETED lists no aborted table (before: ``aborted_data_collections`` named
    the table it had just read in full; found by the property simulation's re-create
    step, whose order check saw the table started again while still marked stopped)."""
    core = make(chunk=2)
    core.restart_table("public.t", queue=True)
    core.restart_table("public.u", queue=True)
    log = signal(core, "stop-snapshot", 5, data_collections=["public\\.t"])
    core.restart_table("public.t", queue=True)
    for lsn in (10, 30):
        log += start_table(core, lsn, max_key=(1,))
        _, out = chunk(core, [row(1)], lsn + 10)
        log += out
    assert not core.active
    assert [n["type"] for n in terminals(log, "initial")] == ["COMPLETED"]
    assert "aborted_data_collections" not in terminals(log, "initial")[0]["additional_data"]
    # a stop of it (again) after that still makes it an aborted one
    core.restart_table("public.t", queue=True)
    core.restart_table("public.u", queue=True)
    log = signal(core, "stop-snapshot", 50, data_collections=["public\\.t"])
    log += start_table(core, 60, max_key=(1,))
    _, out = chunk(core, [row(1)], 70)
    ends = terminals(log + out, "initial")
    assert ends[0]["additional_data"]["aborted_data_collections"] == ["public.t"]
