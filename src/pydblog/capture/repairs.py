"""The capture's side of a repair (``core.repair``): the range-end marker.

A repair is an incremental snapshot of key ranges (the signal's ``repair`` entries, its
rows restricted to the ranges by ``additional-conditions``). Its table's
TABLE_SCAN_COMPLETED notification is the range-end marker: the capture logs it with
``after = {"repair": {"key": [...], "ranges": [{"lo", "hi"}...], "keep": [[...]...]}}``
where ``keep`` is every key of the table with an event in the change log from the
repair's start (its STARTED notification) to the marker: the rows the repair emitted
and every key changed while it ran. The sinks delete the other keys of the ranges.

Exactness needs ``keep`` to cover everything logged before the marker, so the marker is
not logged where the core produces it (often inside a watermark's transaction, with
events still on their way to the log): it is deferred, in the checkpoint's ``extra``
(atomically with the core state that says the table is done, so a crash loses
nothing), and logged at the next transaction boundary once everything before it is
durable. The repair's start offset is kept there too: the change log's end when its
STARTED notification was emitted (at or before that notification: a wider span only
keeps more keys, each decided by its own events).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from pydblog.core.repair import RangeEnd
from pydblog.events import ChangeEvent, Op, SnapshotKind
from pydblog.ports import ChangeLogReader
from pydblog.positions import decode_position, encode_position

REPAIR_SPANS = "repair_spans"
"""Checkpoint extra: signal id -> change-log offset where its repair's span starts."""
REPAIR_MARKERS = "repair_markers"
"""Checkpoint extra: repair TABLE_SCAN_COMPLETED notifications waiting to be logged."""


def kind_of(ev: ChangeEvent) -> str | None:
    """``"start"`` for a repair's STARTED notification, ``"end"`` for a repair table's
    TABLE_SCAN_COMPLETED, ``"done"`` for any snapshot's COMPLETED/ABORTED, else None."""
    note = ev.notification
    if ev.op is not Op.NOTIFICATION or not note:
        return None
    kind = note.get("type")
    data = note.get("additional_data") or {}
    if kind == "STARTED" and data.get("repair"):
        return "start"
    if kind == "TABLE_SCAN_COMPLETED" and data.get("repair"):
        return "end"
    if kind in ("COMPLETED", "ABORTED"):
        return "done"
    return None


def stored(ev: ChangeEvent) -> dict[str, Any]:
    """A deferred notification as JSON (for the checkpoint's extra)."""
    return {
        "schema": ev.schema,
        "table": ev.table,
        "position": encode_position(ev.position),
        "ts_ms": ev.ts_ms,
        "snapshot": ev.snapshot.value,
        "notification": ev.notification,
    }


def span_keys(reader: ChangeLogReader, table: str, key: Sequence[str],
              ranges: Sequence[RangeEnd], start: int, end: int,
              batch: int = 10_000) -> list[list[Any]]:
    """Every key of ``table`` (values of the ``key`` columns, as logged) with an event
    at ``start <= offset < end`` that lies in one of ``ranges`` (a key the ranges
    cannot be compared with is kept too), an update that moved a key giving both."""
    found: dict[bytes, list[Any]] = {}
    offset = start
    while offset < end:
        recs = [r for r in reader.read(offset, batch, [table]) if r.offset < end]
        if not recs:
            break
        for rec in recs:
            if rec.op not in ("c", "u", "d", "r"):
                continue
            body = orjson.loads(rec.body)
            for image in (body.get("key"), body.get("before"), body.get("after")):
                if not isinstance(image, dict) or not all(k in image for k in key):
                    continue
                k = tuple(image[c] for c in key)
                if _in_any(k, ranges):
                    found.setdefault(orjson.dumps(k), list(k))
        offset = recs[-1].offset + 1
    return list(found.values())


def _in_any(key: tuple[Any, ...], ranges: Sequence[RangeEnd]) -> bool:
    for r in ranges:
        try:
            if r.holds(key):
                return True
        except TypeError:
            return True
    return False


def marker_event(entry: dict[str, Any], key: Sequence[str], keep: list[list[Any]]) -> ChangeEvent:
    """The deferred notification, with ``after`` holding the repair for the sinks."""
    note = dict(entry["notification"])
    data = dict(note.get("additional_data") or {})
    repair = dict(data.get("repair") or {})
    data["repair"] = {**repair, "key": list(key), "kept": len(keep)}
    note["additional_data"] = data
    return ChangeEvent(
        op=Op.NOTIFICATION,
        schema=entry["schema"],
        table=entry["table"],
        position=decode_position(entry["position"]),
        ts_ms=int(entry["ts_ms"]),
        after={"repair": {"key": list(key), "ranges": repair.get("ranges") or [], "keep": keep}},
        snapshot=SnapshotKind(entry["snapshot"]),
        notification=note,
    )


def ranges_of(entry: dict[str, Any], table: str) -> list[RangeEnd]:
    data = (entry["notification"].get("additional_data") or {}).get("repair") or {}
    return [
        RangeEnd(table, 0, None if r.get("lo") is None else tuple(r["lo"]),
                 None if r.get("hi") is None else tuple(r["hi"]))
        for r in data.get("ranges") or [{"lo": None, "hi": None}]
    ]
