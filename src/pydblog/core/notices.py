"""Progress notifications (``op: "n"`` events) and the positions the core gives its events.

A notification event (Debezium-like; see docs/snapshots.md)::

    ChangeEvent(op=Op.NOTIFICATION, schema="public", table="orders" (or "" and ""),
                position=..., ts_ms=..., snapshot=INCREMENTAL | BLOCKING,
                notification={"aggregate_type": "Incremental Snapshot" | "Blocking Snapshot",
                              "type": "STARTED" | ... (NotificationType),
                              "signal_id": "...",
                              "additional_data": {...JSON...}})

Positions. The core never invents a position out of nothing; every event it returns is
placed relative to a position nobody else logs:

- a signal's notification takes the signal event's own position (signal rows are
  never logged), so one signal yields exactly one notification;
- at a watermark W (never logged either, and alone in its transaction), the k-th event
  the core emits is at ``W.index + 1 + k`` (k = 0, 1, ...) with W's other fields;
- during a blocking snapshot, at ``A.index + 1 + k`` after the anchor A (the highest
  position logged when the stream was paused), k counting on across calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydblog.core.progress import TableJob, json_key, repair_json
from pydblog.events import ChangeEvent, ChunkRow, Emitted, Op, SnapshotKind, SnapshotRows
from pydblog.positions import Position, decode_position, encode_position


class NotificationType(StrEnum):
    STARTED = "STARTED"
    TABLE_SCAN_STARTED = "TABLE_SCAN_STARTED"
    IN_PROGRESS = "IN_PROGRESS"
    TABLE_SCAN_COMPLETED = "TABLE_SCAN_COMPLETED"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    PAUSED = "PAUSED"
    RESUMED = "RESUMED"
    REJECTED = "REJECTED"
    SKIPPED = "SKIPPED"


AGGREGATE_TYPE = {
    SnapshotKind.INCREMENTAL: "Incremental Snapshot",
    SnapshotKind.BLOCKING: "Blocking Snapshot",
    SnapshotKind.NONE: "Snapshot",
}


@dataclass(frozen=True, slots=True)
class Notice:
    """A notification not yet placed at a position (JSON-serializable, so notices waiting
    for a position survive a restart in ``SnapshotCore.state()``)."""

    type: NotificationType
    signal_id: str
    kind: SnapshotKind
    table: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "signal_id": self.signal_id,
            "kind": self.kind.value,
            "table": self.table,
            "data": self.data,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Notice:
        return cls(
            NotificationType(data["type"]),
            str(data["signal_id"]),
            SnapshotKind(data["kind"]),
            str(data.get("table", "")),
            dict(data.get("data") or {}),
        )

    def event(self, position: Position, ts_ms: int) -> ChangeEvent:
        schema, table = split_table(self.table)
        return ChangeEvent(
            op=Op.NOTIFICATION,
            schema=schema,
            table=table,
            position=position,
            ts_ms=ts_ms,
            snapshot=self.kind,
            notification={
                "aggregate_type": AGGREGATE_TYPE[self.kind],
                "type": self.type.value,
                "signal_id": self.signal_id,
                "additional_data": self.data,
            },
        )


def split_table(qualified: str) -> tuple[str, str]:
    """``"schema.table"`` -> ``("schema", "table")`` (split at the first dot; ``""`` ->
    ``("", "")``)."""
    schema, dot, table = qualified.partition(".")
    return (schema, table) if dot else ("", qualified)


def position_index(position: Position) -> int:
    """The index-in-transaction of a position (every source position has one)."""
    index: int = getattr(position, "index")  # noqa: B009 - not part of the Protocol
    return index


def at_index(position: Position, index: int) -> Position:
    """``position`` with another index."""
    return position.with_index(index)


class PositionCursor:
    """Hands out ``base.index + 1``, ``+ 2``, ... : fresh positions right after ``base``.

    Invariant: every position handed out is greater than ``base`` and than every one
    handed out before; the caller must own the slot after ``base`` (see module doc).
    """

    __slots__ = ("base", "count", "ts_ms")

    def __init__(self, base: Position, ts_ms: int) -> None:
        self.base = base
        self.ts_ms = ts_ms
        self.count = 0

    def next(self) -> Position:
        return at_index(self.base, self.take(1))

    def take(self, n: int) -> int:
        """Reserves the next ``n`` positions; returns the index of the first."""
        first = position_index(self.base) + self.count + 1
        self.count += n
        return first

    def place(self, notices: list[Notice]) -> list[ChangeEvent]:
        return [n.event(self.next(), self.ts_ms) for n in notices]


class Outbox:
    """Where the core's events are placed: ``horizon``, the highest position the core
    has seen or given an event, and ``waiting``, the notifications that wait for a
    position (placed with the next events the core returns at a watermark, a passed
    fence, a boundary or the blocking anchor).

    Invariants: ``rows`` and ``place`` move ``horizon`` to the last position they hand
    out (a cursor's positions only grow, so ``horizon`` never goes back through them);
    ``waiting`` notices are placed before the ones given with them, once each."""

    __slots__ = ("horizon", "waiting")

    def __init__(self) -> None:
        self.horizon: Position | None = None
        self.waiting: list[Notice] = []

    def advance(self, position: Position) -> None:
        """A position the stream delivered (or the change log holds)."""
        if self.horizon is None or self.horizon < position:
            self.horizon = position

    def rows(
        self, cursor: PositionCursor, schema: str, table: str, kind: SnapshotKind,
        rows: Sequence[ChunkRow], key_columns: tuple[str, ...], identity: tuple[str, ...] = (),
    ) -> list[Emitted]:
        """Snapshot rows as ``op: r`` events at the cursor's next positions (one
        ``SnapshotRows`` for the whole chunk)."""
        if not rows:
            return []
        first = cursor.take(len(rows))
        batch = SnapshotRows(schema, table, kind, cursor.base, first, cursor.ts_ms, rows,
                             key_columns, identity)
        self.horizon = batch.last_position
        return [batch]

    def job_rows(self, job: TableJob, rows: Sequence[ChunkRow], cursor: PositionCursor) -> list[Emitted]:
        """``rows`` of a started table's chunk."""
        assert job.key_columns is not None
        return self.rows(cursor, job.schema_name, job.table_name, job.kind, rows,
                         job.key_columns, job.identity or ())

    def to_json(self) -> dict[str, Any]:
        return {
            "notices": [n.to_json() for n in self.waiting],
            "horizon": None if self.horizon is None else encode_position(self.horizon),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.waiting = [Notice.from_json(n) for n in state.get("notices", [])]
        horizon = state.get("horizon")
        self.horizon = None if horizon is None else decode_position(horizon)

    def place(self, cursor: PositionCursor, notices: list[Notice]) -> list[Emitted]:
        """Waiting notices, then ``notices``, at the cursor's next positions."""
        waiting, self.waiting = self.waiting, []
        events = cursor.place(waiting + notices)
        if events:
            self.horizon = events[-1].position
        out: list[Emitted] = list(events)
        return out


# -- notifications about one table's job -------------------------------------------------


def _for(job: TableJob, type: NotificationType, data: dict[str, Any], table: str = "") -> Notice:
    return Notice(type, job.signal_id, job.kind, table, data)


def table_rejected(job: TableJob, reason: str, **extra: Any) -> Notice:
    return _for(job, NotificationType.REJECTED, {"reason": reason, **extra}, job.table)


def _repair(job: TableJob, data: dict[str, Any]) -> dict[str, Any]:
    """A repair's notices carry its ranges (the capture adds ``keep`` to the
    TABLE_SCAN_COMPLETED one before logging it: see ``core.repair``)."""
    if job.repair is not None:
        data["repair"] = {"ranges": repair_json(job.repair)}
    return data


def table_empty(job: TableJob) -> Notice:
    data = {"data_collection": job.table, "status": "EMPTY", "total_rows_scanned": 0}
    return _for(job, NotificationType.TABLE_SCAN_COMPLETED, _repair(job, data), job.table)


def table_scan_started(job: TableJob) -> Notice:
    """For a started job (key columns and max key known)."""
    data = {
        "data_collection": job.table,
        "key_columns": list(job.key_columns or ()),
        "maximum_key": json_key(job.max_key),
        "condition": job.condition,
    }
    return _for(job, NotificationType.TABLE_SCAN_STARTED, _repair(job, data), job.table)


def table_scan_completed(job: TableJob) -> Notice:
    data = {
        "data_collection": job.table,
        "status": "SUCCEEDED",
        "total_rows_scanned": job.rows,
        "chunks": job.chunks,
    }
    return _for(job, NotificationType.TABLE_SCAN_COMPLETED, _repair(job, data), job.table)


def in_progress(job: TableJob, tables: list[str], percent: float) -> Notice:
    data = {
        "data_collections": tables,
        "current_collection_in_progress": job.table,
        "maximum_key": json_key(job.max_key),
        "last_processed_key": json_key(job.last_key),
        "rows_scanned": job.rows,
        "chunks": job.chunks,
        "percent": percent,
    }
    return _for(job, NotificationType.IN_PROGRESS, data, job.table)


def lane_completed(
    job: TableJob, tables: int, rows: int, chunks: int, aborted: Sequence[str] = ()
) -> Notice:
    """The last table of a snapshot (``job``'s signal id) is done; ``aborted``: its
    tables a stop-snapshot removed before."""
    data: dict[str, Any] = {"tables": tables, "rows": rows, "chunks": chunks}
    if aborted:
        data["aborted_data_collections"] = list(aborted)
    return _for(job, NotificationType.COMPLETED, data)
