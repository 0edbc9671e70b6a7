"""Change events and their Debezium-style envelope.

An event is immutable and carries values already mapped to JSON types (see
``docs/types.md``): the change log stores exactly what ``dblog tail`` prints.

Envelope (one JSON object; ``offset`` is added by the change log at append)::

    {"offset": 17, "op": "u", "ts_ms": ...,
     "source": {"connector", "db", "schema", "table", "lsn", "txId", "ts_ms", "snapshot"},
     "key": {...}, "before": {...} | null, "after": {...} | null}

Optional fields: ``unchanged`` (columns whose value was not sent by the source, an
unchanged TOAST value; their ``after`` value is the placeholder ``UNCHANGED_TOAST``
and consumers keep the value they have) and ``notification`` (``op: "n"`` events).
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

from pydblog.positions import Position

Row = dict[str, Any]

UNCHANGED_TOAST = "__dblog_unchanged_toast__"
"""Placeholder value of a column the source did not send (see ``ChangeEvent.unchanged``)."""


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"
    TRUNCATE = "t"
    NOTIFICATION = "n"


class SnapshotKind(StrEnum):
    NONE = "false"
    INCREMENTAL = "incremental"
    BLOCKING = "blocking"


class ChangeEvent(NamedTuple):
    """One change of one row (or one table, for truncate and notifications).

    ``position`` orders events within a source; ``ts_ms`` is the source commit time.
    Immutable. A ``NamedTuple`` rather than a frozen dataclass: one is built per
    captured row, and a frozen dataclass costs four times as much to construct.
    """

    op: Op
    schema: str
    table: str
    position: Position
    ts_ms: int
    key: Row | None = None
    before: Row | None = None
    after: Row | None = None
    snapshot: SnapshotKind = SnapshotKind.NONE
    unchanged: tuple[str, ...] = ()
    notification: Row | None = None

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    def envelope(self, connector: str, db: str, now_ms: int | None = None) -> Row:
        """The envelope as a dict (enums are ``str`` subclasses, serialized as their
        values)."""
        source: Row = {
            "connector": connector,
            "db": db,
            "schema": self.schema,
            "table": self.table,
        }
        source.update(self.position.source_fields())
        source["ts_ms"] = self.ts_ms
        source["snapshot"] = self.snapshot
        env: Row = {
            "op": self.op,
            "ts_ms": now_ms if now_ms is not None else int(time.time() * 1000),
            "source": source,
            "key": self.key,
            "before": self.before,
            "after": self.after,
        }
        if self.unchanged:
            env["unchanged"] = list(self.unchanged)
        if self.notification is not None:
            env["notification"] = self.notification
        return env


class EncodedEvent(NamedTuple):
    """An event ready for the change log: the columns it is indexed by and its body
    (the JSON envelope; ``str`` from the encoder: orjson's ``bytes`` results keep a
    4 KiB allocation each, a ``str`` copy is right-sized)."""

    table: str
    op: str
    ts_ms: int
    body: str | bytes


def encode_event(event: ChangeEvent, connector: str, db: str, now_ms: int) -> EncodedEvent:
    return EncodedEvent(
        f"{event.schema}.{event.table}",
        event.op,
        event.ts_ms,
        orjson.dumps(event.envelope(connector, db, now_ms)).decode(),
    )


def with_offset(offset: int, body: bytes) -> bytes:
    """The envelope with ``offset`` as its first field (bodies are stored without it)."""
    return b'{"offset":%d,%s' % (offset, body[1:])


def decode_envelope(offset: int, body: bytes) -> Row:
    env: Row = orjson.loads(body)
    return {"offset": offset, **env}
