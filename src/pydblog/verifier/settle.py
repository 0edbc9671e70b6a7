"""Telling drift from lag.

A mirror reflects a prefix of the change log: the events below its applied offset
``A``. A read of the source reflects every event logged before the read began (offset
``O_start``, read just before it) and possibly some logged after, but none logged after
the capture passed the source position ``L`` taken just after the read (offset
``O_L``). So a key with no event in the change log between
``min(O_start, A)`` and ``max(O_L, A)`` has, on both sides, the value its older events
gave it: if the two sides differ on it, the mirror drifted. A differing key with an
event in that window may only be lagging: it is read again once the mirror has
applied past ``O_L`` (``unsettled`` keys are never reported as drift).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from pydblog.ports import ChangeLogReader, TableSchema
from pydblog.verifier.ranges import Key, frozen, key_columns, value

WHOLE_TABLE = "whole-table"
"""``touched``'s answer when the window holds a truncate (every key may have moved)."""


SourceMark = int | Callable[[Any], bool]
"""Where the source stood after a read: a PostgreSQL WAL position (an int), or a test of
the capture's checkpoint position (a MySQL/MariaDB GTID state, ``verifier.mysql``)."""


def capture_passed(reader: ChangeLogReader, lsn: SourceMark) -> int | None:
    """The change log's end once the capture has logged every source change before
    ``lsn`` (its checkpoint is at or past it), else ``None``."""
    cp = reader.last_checkpoint()
    if cp is None or cp.position is None:
        return None
    pos = cp.position
    if callable(lsn):
        return reader.next_offset() if lsn(pos) else None
    at = getattr(pos, "ack_lsn", None)
    if at is None:
        return None
    if int(at.value if hasattr(at, "value") else at) < lsn:
        return None
    return reader.next_offset()


def wait_capture(reader: ChangeLogReader, lsn: SourceMark, timeout_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> int | None:
    """``capture_passed``, polled until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = capture_passed(reader, lsn)
        if found is not None or time.monotonic() >= deadline:
            return found
        sleep(0.2)


def touched(reader: ChangeLogReader, schema: TableSchema, start: int, end: int,
            batch: int = 10_000) -> set[Key] | str:
    """The normalized keys of ``schema``'s table that have an event at offsets
    ``start <= offset < end`` (an update that moved a key names both keys), or
    ``WHOLE_TABLE`` when a truncate is among them."""
    out: set[Key] = set()
    if end <= start:
        return out
    cols = key_columns(schema)
    logical = {c.name: c.logical for c in schema.columns}
    offset = start
    while offset < end:
        recs = reader.read(offset, batch, [schema.qualified])
        recs = [r for r in recs if r.offset < end]
        if not recs:
            break
        for rec in recs:
            if rec.op == "t":
                return WHOLE_TABLE
            body = orjson.loads(rec.body)
            for part in (body.get("key"), body.get("after"), body.get("before")):
                if isinstance(part, dict) and all(k in part for k in cols):
                    out.add(frozen(tuple(value(logical[k], part[k]) for k in cols)))
        offset = recs[-1].offset + 1
    return out


def events_between(reader: ChangeLogReader, table: str, start: int, end: int) -> bool:
    """Whether ``table`` has any event at ``start <= offset < end``."""
    if end <= start:
        return False
    recs = reader.read(start, 1, [table])
    return bool(recs) and recs[0].offset < end


def wait_mirror(applied: Callable[[], int], reader: ChangeLogReader, table: str, target: int,
                timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> int:
    """Wait until a mirror has applied every event of ``table`` below ``target`` (its
    applied offset is there, or the table has no event between it and ``target``);
    the applied offset last seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        at = applied()
        if at >= target or not events_between(reader, table, at, target):
            return at
        if time.monotonic() >= deadline:
            return at
        sleep(0.2)


def classify(differing: Sequence[Key], moved: set[Key] | str) -> tuple[set[Key], set[Key]]:
    """(drift, unsettled): the differing keys without an event in the window, and those
    with one."""
    if isinstance(moved, str):
        return set(), set(differing)
    drift = {k for k in differing if k not in moved}
    return drift, set(differing) - drift
